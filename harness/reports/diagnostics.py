"""Markdown of the diagnostics block (harness.metrics.diagnostics), shared by shard reports and published pages."""

from __future__ import annotations

from harness.io.md_table import md_table
from harness.metrics.records import Diagnostics
from harness.reports.numbers import fmt_interval as _iv
from harness.reports.numbers import fmt_value as _g

__all__ = ["diagnostics_lines"]


def diagnostics_lines(d: Diagnostics) -> list[str]:
    """The ``## Diagnostics`` section: scalar scores, then KLD by reference confidence and by entropy decile."""
    st = d["same_top"]
    se_iid = st.get("se_iid")
    se = "" if se_iid is None else f" ± {100 * se_iid:.3f} % (i.i.d. SE)"
    lines = ["## Diagnostics", ""]
    lines += md_table(["score", "value", "95% interval"], [
        ["mean reverse KL(q‖p) (nats)", _g(d["kld_rev"]["mean"]), _iv(d["kld_rev"].get("ci95"))],
        ["top-5 overlap (fraction of the reference's top 5 kept)", _g(d["top5_overlap"]["mean"]),
         _iv(d["top5_overlap"].get("ci95"))],
        ["top-10 overlap", _g(d["top10_overlap"]["mean"]), _iv(d["top10_overlap"].get("ci95"))],
        ['same top (llama-perplexity\'s "Same top p")', f"{100 * st['fraction']:.3f} %{se}", ""],
        ["candidate probability of the reference's top token (mean)", _g(d["q_ref_top_mean"]), ""],
        ["reference top probability (mean)", _g(d["p_ref_top_mean"]), ""],
        ["reference entropy (mean, nats)", _g(d["entropy_ref_mean"]), ""],
    ])
    lines += ["", "### KLD by reference confidence (top probability)", ""]
    lines += md_table(["p(top)", "positions", "mean KLD", "top-1"],
                      [[f"[{r['lo']:g}, {r['hi']:g}{']' if r['hi'] == 1.0 else ')'}", r["positions"], _g(r["mean_kld"]),
                        _g(r["top1"])] for r in d["by_confidence"]])
    lines += [
        "",
        "### KLD by reference-entropy decile",
        "",
        "Deciles are runs of whole fixed entropy bins (40 a decade), so their counts are about, not exactly, a tenth.",
        "",
    ]
    lines += md_table(["decile", "entropy (nats)", "positions", "mean KLD"],
                      [[dec["decile"], f"[{_g(dec['lo'], 3)}, {'∞' if dec['hi'] is None else _g(dec['hi'], 3)})",
                        dec["positions"], _g(dec["mean_kld"])] for dec in d["by_entropy_decile"]])
    lines.append("")
    return lines
