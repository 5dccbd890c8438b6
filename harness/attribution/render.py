"""The attribution's files: ``attribution.json``, ``attribution.md`` (ranked tables) and ``attribution.png``.

Everything is rendered in memory first and then written, each file atomically, so an interrupted
or refused run leaves no partial output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.attribution.groups import KIND_ROLES
from harness.io.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from harness.io.figure import png_bytes
from harness.io.md_table import md_table


def _g(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3e}" if x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e4) else f"{x:.4f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _ci(d: dict[str, Any] | None) -> str:
    if not d:
        return "—"
    ci = d.get("ci95")
    return f"{_g(d['value'])} [{_g(ci[0])}, {_g(ci[1])}]" if ci else f"{_g(d['value'])} [not estimable]"


def setting_note(r: dict[str, Any]) -> str:
    """What makes KLD(candidate) here differ from the ladder's number for the same candidate and shards: the
    forward's dtype and the reference side (stated next to the number)."""
    dtype = r["compute"]["dtype"]
    note = (f"{dtype} forward of both models' stored weights in this process, the reference captured here; the ladder "
            "scores bf16 executions against the committed reference capture")
    if dtype != "bfloat16":
        note += (f" and includes both forwards' bf16 rounding, which this {dtype} forward leaves out (--dtype bfloat16 "
                 "comes close to the ladder)")
    return note


def render_markdown(r: dict[str, Any]) -> str:
    """Ranked tables per grouping, additivity and the bits-to-spend suggestion."""
    lines = [
        f"# Attribution: {r['candidate']['path']} vs {r['reference']['path']}", "",
        (f"Suite {r['suite']['path']} shards {r['suite']['shards']}: {r['n_positions']} positions, "
        f"{r['n_contexts']} contexts, {r['n_clusters']} source clusters; {r['differing_params']} parameters differ. "
        f"KLD(candidate) = {_ci(r['whole'])} nats ({setting_note(r)}). Intervals: 95%, {r['bootstrap'].get('method_text', r['bootstrap']['method'])}, "
        f"{r['bootstrap']['n_boot']} replicates, seed {r['bootstrap']['seed']}."), "",
        ("ΔKLD restore = KLD(candidate) − KLD(candidate with the group restored to the reference's weights); "
        "KLD only = KLD(reference with only this group taken from the candidate)."), "",
    ]
    for g in r["groupings"]:
        routed = any("routing" in row for row in g["groups"])
        lines += [f"## By {g['rule']}", ""]
        lines += md_table(
            ["rank", "group", "params", "bytes", "share of bytes", "ΔKLD restore [95% CI]", "share of whole",
             "KLD only [95% CI]", "ΔKLD per MiB"] + (["routed (share of the layer's top-k picks)"] if routed else []),
            [[row["rank"], row["group"], row["n_params"], row["bytes"], _pct(row["byte_share"]), _ci(row.get("restore")),
              _pct(row.get("restore_share_of_whole")), _ci(row.get("only")), _g(row.get("restore_per_mib"))]
             + ([_pct((row.get("routing") or {}).get("share"))] if routed else []) for row in g["groups"]])
        roles = [f"`{row['group']}`: {KIND_ROLES[row['group']]}" for row in g["groups"]
                 if g["rule"] == "kind" and row["group"] in KIND_ROLES]
        if roles:
            lines += ["", "Kinds: " + "; ".join(roles) + "."]
        add = g.get("additivity")
        lines.append("")
        if add:
            lines.append(f"Additivity: Σ ΔKLD restore = {_ci(add['sum_restore'])} = {100 * (add['explained_restore'] or 0):.1f}% of the whole; "
                         f"interaction (whole − Σ) = {_ci(add['interaction_restore'])}"
                         + (" — the effects do not add up: interactions are real." if add["interaction_restore"]["excludes_zero"] else " — consistent with additive effects."))
            if "sum_only" in add:
                lines.append(f"Σ KLD only = {_ci(add['sum_only'])} ({100 * (add['explained_only'] or 0):.1f}% of the whole); "
                             f"interaction = {_ci(add['interaction_only'])}.")
        else:
            lines.append("Additivity: not computed (the groups overlap or leave parameters out).")
        spend = g.get("bits_to_spend") or []
        lines += ["", "Bits to spend (ΔKLD per MiB of the group's bytes, groups whose interval lies above zero):"]
        lines += [f"{i}. {s['group']}: {_g(s['restore_per_mib'])} nats/MiB (ΔKLD {_g(s['restore'])}; restoring it to the "
                  f"reference costs {s['restore_cost_bytes']} more bytes)" for i, s in enumerate(spend[:5], 1)] or ["none resolved on this suite"]
        lines.append("")
    return "\n".join(lines) + "\n"


def render_plot(r: dict[str, Any]) -> bytes:
    """Horizontal bars of ΔKLD restore (and KLD only) per group with their 95% intervals, one panel per grouping."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import numpy as np

    gs = r["groupings"]
    fig, axes = plt.subplots(len(gs), 1, figsize=(8, 1.2 + 0.45 * sum(len(g["groups"]) for g in gs) + 0.6 * len(gs)), squeeze=False)
    for ax, g in zip(axes[:, 0], gs):
        rows = g["groups"]
        y = np.arange(len(rows))
        for off, key, label in ((-0.2, "restore", "ΔKLD restore (leave-one-in)"), (0.2, "only", "KLD only this group (leave-one-out)")):
            if not all(key in row for row in rows):
                continue
            v = np.array([row[key]["value"] for row in rows])
            ci = [row[key]["ci95"] or [row[key]["value"]] * 2 for row in rows]
            err = np.array([[max(vi - c[0], 0.0) for vi, c in zip(v, ci)], [max(c[1] - vi, 0.0) for vi, c in zip(v, ci)]])
            ax.barh(y + off, v, height=0.38, xerr=err, capsize=3, label=label)
        ax.set_yticks(y, [row["group"] for row in rows])
        ax.invert_yaxis()
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_title(f"by {g['rule']} (whole KLD {r['whole']['value']:.3g} nats)")
        ax.set_xlabel("nats (95% studentized paired cluster-bootstrap intervals)")
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return png_bytes(fig, dpi=110)


def write_attribution(r: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Render everything, then write the three files atomically; returns their paths."""
    return write_rendered(out_dir, "attribution", r, render_markdown(r), render_plot(r))


def write_rendered(out_dir: str | Path, stem: str, r: dict[str, Any], md: str, png: bytes) -> list[Path]:
    """``<stem>.json`` (the document ``r``), ``<stem>.md`` and ``<stem>.png``, each written atomically once all
    three are rendered; returns their paths."""
    out = Path(out_dir)
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    atomic_write_json(paths[0], r)
    atomic_write_text(paths[1], md)
    atomic_write_bytes(paths[2], png)
    return paths
