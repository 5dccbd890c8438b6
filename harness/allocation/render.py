"""The files of ``fidelity allocate``: ``allocation.json``, ``allocation.md``, each proposal's layout in the
formats people quantize with, and (after building and scoring) ``kld-vs-size.png``.

Per proposal ``<out>/<proposal>/``: ``layout.json`` ({unit: choice}); for the project family ``recipe.yaml``
(llm-compressor, :func:`harness.allocation.outputs.llmcompressor_recipe`); for GGUF ``tensor-types.txt``
(``llama-quantize`` arguments). The built candidates themselves are under ``<out>/check/candidates/``.
Everything is rendered in memory, then written as one unit.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.allocation.gguf_format import tensor_type_lines
from harness.allocation.outputs import llmcompressor_recipe
from harness.allocation.records import AllocationCheck, AllocationResult
from harness.attribution.effects import Estimate
from harness.io.atomic import atomic_write_files
from harness.io.md_table import md_table
from harness.reports.plot import kld_vs_size_figure


def _g(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3e}" if x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e4) else f"{x:.4f}"


def _ci(d: Estimate | None) -> str:
    if not d:
        return "—"
    ci = d["ci95"]
    return f"{_g(d['value'])} [{_g(ci[0])}, {_g(ci[1])}]" if ci else f"{_g(d['value'])} [not estimable]"


def render_markdown(r: AllocationResult, check: AllocationCheck | None = None) -> str:
    """Effects, proxy agreement, proposals with predicted vs measured KLD, and the paired comparisons."""
    ra = r["proxy"]["rank_agreement"]
    lines = [
        f"# Layout search ({r['family']}): {r['reference']}", "",
        (f"Suite {r['suite']['path']} shards {r['suite']['shards']} ({r['n_positions']} positions, {r['n_contexts']} "
         f"contexts, {r['n_clusters']} source clusters). Choices: {', '.join(r['choices'])}; grouping "
         f"`{r['grouping']}` ({len(r['groups'])} groups); base `{r['base']['spec']}`: {r['base']['bytes']} stored bytes, "
         f"KLD {_ci(r['base']['kld'])} nats (in process). Effects used by the knapsack: **{r['effects_used']}**. "
         f"Intervals: 95%, {r['bootstrap']['method_text']}."), "",
        f"Additivity assumption: {r['additivity']}.", "",
        (f"Proxy ({r['proxy']['definition']}; {r['proxy']['contexts']} contexts) against the measured effects over "
         f"{ra['n']} (group, choice) pairs: Spearman ρ = {_g(ra['spearman'])}, Kendall τ = {_g(ra['kendall'])}."), "",
        "## Measured effects (each choice with the other groups at the base, paired with the base)", "",
    ]
    lines += md_table(["group", "choice", "ΔKLD [95% CI]", "bytes", "Δbytes vs base", "proxy"],
                      [[e["group"], e["choice"], _ci(e["delta_kld"]), e["bytes"], f"{e['bytes'] - e['base_bytes']:+d}",
                        _g(e["proxy"])] for e in r["effects"]])
    lines += ["", "## Proposals (in process, on the search's shards)", ""]
    lines += md_table(["budget", "bytes (budget)", "predicted KLD", "measured in process",
                       "interaction (measured − predicted)", "groups"],
                      [[p["budget_spec"], f"{p['predicted_bytes']} ({p['budget_bytes']})", _ci(p["predicted_kld"]),
                        _ci(p["in_process_kld"]), _ci(p["interaction"]), ", ".join(f"{g}: {c}" for g, c in p["groups"].items())]
                       for p in r["proposals"]])
    if check is not None:
        lines += ["", f"## Built and scored as ordinary candidates ({check['engine']}, shards {check['shards']})", ""]
        rows = []
        for q in check["proposals"]:
            c = q.get("comparator")
            pair = (["—", "—", "—", "—"] if c is None else
                    [f"{c['candidate']} ({c['on_disk_bytes']} bytes, ×{c['size_ratio']:.4f})", _ci(c["measured_kld"]),
                     _ci({"value": c["paired"]["diff"], "ci95": c["paired"]["ci95"]}), c["paired"]["verdict"]])
            rows.append([q["candidate"], q["on_disk_bytes"], _ci(q["predicted_kld"]), _ci(q["measured_kld"]), *pair])
        lines += md_table(["candidate", "on-disk bytes", "predicted KLD", "measured KLD [95% CI]", "versus", "its KLD",
                           "paired diff [95% CI]", "verdict"], rows)
        for q in check["proposals"]:
            b = q.get("predicted_kld_on_measured_base")
            if b is not None:
                lines.append(f"- {q['candidate']}: predicted on the base as scored here ({b['base']} {_g(b['base_kld'])} + "
                             f"Σ Δ {_g(b['value'] - b['base_kld'])}) = {_g(b['value'])}; measured {_g(q['measured_kld']['value'])}")
            c = q.get("comparator")
            h = c.get("paired_held_out") if c is not None else None
            if c is not None and h is not None:
                lines.append(f"- {q['candidate']} vs {c['candidate']} on the shards the search did not see "
                             f"({h['shards']}): {_ci({'value': h['diff'], 'ci95': h['ci95']})}, {h['verdict']}")
        lines += ["", "Every proposal against every uniform layout at least as large (paired, same positions):", ""]
        lines += md_table(["proposed", "versus", "bytes (proposed / versus)", "diff [95% CI]", "verdict"],
                          [[w["proposed"], w["versus"], f"{w['proposed_bytes']} / {w['versus_bytes']}",
                            _ci({"value": w["diff"], "ci95": w["ci95"]}), w["verdict"]] for w in check["pairs"]])
        lines += ["", "Measured candidates:", ""]
        lines += md_table(["candidate", "on-disk bytes", "mean KLD [95% CI]"],
                          [[n, m["on_disk_bytes"], _ci({"value": m["mean_kld"], "ci95": m["ci95"]})]
                           for n, m in sorted(check["candidates"].items(), key=lambda kv: kv[1]["on_disk_bytes"])])
    return "\n".join(lines) + "\n"


def proposal_files(r: AllocationResult, out: Path, token_embedding_type: str = "Q8_0") -> dict[Path, str]:
    """Each proposal's layout files (module docstring)."""
    files: dict[Path, str] = {}
    for p in r["proposals"]:
        folder = out / f"alloc-{p['budget_spec']}"
        files[folder / "layout.json"] = json.dumps(p["layout"], indent=1, sort_keys=True) + "\n"
        if r["family"] == "project":
            files[folder / "recipe.yaml"] = llmcompressor_recipe(p["layout"])
        else:
            files[folder / "tensor-types.txt"] = "\n".join(tensor_type_lines(p["layout"], token_embedding_type)) + "\n"
    return files


def write_allocation(r: AllocationResult, out: Path, check: AllocationCheck | None = None) -> list[Path]:
    """Write ``allocation.json`` (the search, and ``check`` when given), ``allocation.md``, the layout files and the plot."""
    out = Path(out)
    doc: dict[str, object] = {**r, "check": check} if check is not None else dict(r)  # an AllocationDoc
    files: dict[Path, bytes | str] = {out / "allocation.json": json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n",
                                      out / "allocation.md": render_markdown(r, check)}
    files.update(proposal_files(r, out))
    if check is not None:
        import io

        fig, _axes, _labels = kld_vs_size_figure(check["plot_points"])
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        import matplotlib.pyplot as plt

        plt.close(fig)
        files[out / "kld-vs-size.png"] = buf.getvalue()
    return atomic_write_files(files)
