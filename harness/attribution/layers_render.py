"""The per-layer error's files: ``layers.json``, ``layers.md`` (tables) and ``layers.png`` (error by depth and by kind).

Rendered in memory first, then each file written atomically (harness.attribution.layers has the fields).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.attribution.render import write_rendered
from harness.io.figure import png_bytes
from harness.io.md_table import md_table

__all__ = ["render_layers_markdown", "render_layers_plot", "write_layers"]


def _g(x: float | None) -> str:
    if x is None:
        return "∞"
    return f"{x:.3e}" if x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e4) else f"{x:.4f}"


def _db(x: float | None) -> str:
    return "∞" if x is None else f"{x:.2f}"


def render_layers_markdown(r: dict[str, Any]) -> str:
    """Per-layer table (teacher-forced and free-running), per-kind table, per-module table."""
    lines = [
        f"# Per-layer error: {r['candidate']['path']} vs {r['reference']['path']}", "",
        f"Contexts {r['suite']['contexts']} of {r['suite']['path']} ({r['n_positions']} positions), "
        f"{r['compute']['dtype']} compute on {r['compute']['device']}, {r['timing']['total_s']:.1f} s. "
        "rel = ‖c − r‖_F / ‖r‖_F, cos err = 1 − mean cos(r_t, c_t), SQNR = 10 log10(‖r‖² / ‖c − r‖²). "
        "Teacher-forced: each candidate layer (module) fed the reference's input; free-running: each model on its own. "
        "Distances of hidden states, not effects on the output: `fidelity attribute` measures those.", "",
    ]
    lines += md_table(["layer", "type", "rel (teacher-forced)", "cos err", "SQNR dB", "rel (free-running)", "cos err",
                       "SQNR dB"],
                      [[row["layer"], row.get("layer_type", "decoder"), _g(t["rel_frobenius"]), _g(t["cosine_error"]),
                        _db(t["sqnr_db"]), _g(f["rel_frobenius"]), _g(f["cosine_error"]), _db(f["sqnr_db"])]
                       for row in r["layers"] for t, f in [(row["teacher_forced"], row["free_running"])]])
    lines += ["", f"Worst layers (teacher-forced rel): {', '.join(str(i) for i in r['ranking'])}.", ""]
    if len(r.get("by_layer_type", [])) > 1:
        lines += ["By layer type (teacher-forced, pooled over the layers of the type):", ""]
        lines += md_table(["type", "layers", "rel", "cos err (mean)", "SQNR dB"],
                          [[t["layer_type"], ", ".join(map(str, t["layers"])), _g(t["rel_frobenius"]),
                            _g(t["cosine_error"]), _db(t["sqnr_db"])] for t in r["by_layer_type"]])
        lines.append("")
    lines += ["By module kind (teacher-forced, pooled over layers):", ""]
    lines += md_table(["kind", "modules", "rel", "cos err (mean)", "SQNR dB"],
                      [[k["kind"], k["n_modules"], _g(k["rel_frobenius"]), _g(k["cosine_error"]), _db(k["sqnr_db"])]
                       for k in sorted(r["by_kind"], key=lambda k: -k["rel_frobenius"])])
    lines += ["", "Per module (teacher-forced):", ""]
    lines += md_table(["layer", "module", "rel", "cos err", "SQNR dB"],
                      [[m["layer"], m["name"], _g(m["rel_frobenius"]), _g(m["cosine_error"]), _db(m["sqnr_db"])]
                       for m in r["modules"]])
    return "\n".join(lines) + "\n"


def render_layers_plot(r: dict[str, Any]) -> bytes:
    """Relative error by layer (both modes) and by module kind, PNG bytes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = [row["layer"] for row in r["layers"]]
    a.plot(xs, [row["teacher_forced"]["rel_frobenius"] for row in r["layers"]], "o-", label="teacher-forced")
    a.plot(xs, [row["free_running"]["rel_frobenius"] for row in r["layers"]], "s--", label="free-running")
    a.set_xticks(xs)
    a.set_xlabel("decoder layer")
    a.set_ylabel("‖c − r‖ / ‖r‖ of the layer output")
    a.set_yscale("log")
    a.legend()
    kinds = r["by_kind"]
    b.barh([k["kind"] for k in kinds], [k["rel_frobenius"] for k in kinds])
    b.set_xlabel("‖c − r‖ / ‖r‖ of the module output (teacher-forced)")
    fig.suptitle(f"{Path(r['candidate']['path']).name} vs {Path(r['reference']['path']).name}")
    fig.tight_layout()
    return png_bytes(fig, dpi=110)


def write_layers(r: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Render everything, then write ``layers.json``, ``layers.md`` and ``layers.png``; returns their paths."""
    return write_rendered(out_dir, "layers", r, render_layers_markdown(r), render_layers_plot(r))
