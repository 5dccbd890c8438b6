"""Per-report statistics: ``summarize`` turns per-position scores into a shard report's ``metrics`` block.

The block's shape is :class:`harness.metrics.records.ShardSummary` (KLD in nats; "positions" are the scored
positions after the window ``score_from``); what each field means: docs/design.md, section 3, "The
``metrics`` block, field by field". :func:`merge_totals` combines two shards' ``totals`` exactly as if they
had been scored together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.metrics.bootstrap import (
    DEFAULT_N_BOOT,
    DEFAULT_N_BOOT_TAILS,
    DEFAULT_SEED,
    LEVEL,
    MEAN_METHOD,
    MIN_CLUSTERS,
    TAIL_ALPHA,
    TAIL_METHOD_TEXT,
    TAIL_MIN_CLUSTERS,
    TailData,
    draw_cluster_weights,
    method_text,
    percentile_interval,
    ratio_intervals_read,
    tail_replicates,
)
from harness.metrics.diagnostics import diagnostic_totals, diagnostics_from_totals, merge_diagnostic_totals
from harness.metrics.histogram import LogHistogram, exceedance_counts
from harness.metrics.positions import ContextLabel, Layout, layout
from harness.metrics.records import ContextRow, ShardSummary, StratumRow, Totals, TotalsMeans
from harness.metrics.scores import PositionScores
from harness.metrics.tails import cvar, quantile

N_WORST = 20
DELTA_P_PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


#: Which of ("kld", "top1", "ear", "jsd_bits") are means of nonnegative right-tailed per-position values
#: (:func:`harness.metrics.bootstrap.side_levels`: their upper end is read by the mean's relative standard error and
#: shape, their lower end at ``LOWER_SCALE`` times the stated level, raised with few, spread-out clusters); the
#: agreement rates' heavy side is not known in advance.
RIGHT_SKEWED_MEANS = (True, False, False, True)

def _f(x: Any) -> float:
    return float(x)


def position_arrays(s: PositionScores) -> dict[str, np.ndarray]:
    """The per-position quantities the statistics are built from (float64)."""
    return {
        "kld": s.kld,
        "jsd_bits": s.jsd_bits,
        "ear": s.ear,
        "top1": s.top1.astype(np.float64),
        "nll_ref": s.nll_ref,
        "nll_cand": s.nll_cand,
        "delta_p": np.exp(-s.nll_cand) - np.exp(-s.nll_ref),
        "kld_rev": s.kld_rev,
        "top5_shared": s.top5_overlap.astype(np.float64),
        "top10_shared": s.top10_overlap.astype(np.float64),
    }


def totals(s: PositionScores) -> Totals:
    """Additive totals of a set of positions (merge with :func:`merge_totals`)."""
    a = position_arrays(s)
    return {
        "n_positions": len(s),
        "sum_kld": _f(a["kld"].sum()),
        "sum_jsd_bits": _f(a["jsd_bits"].sum()),
        "sum_ear": _f(a["ear"].sum()),
        "top1_count": int(s.top1.sum()),
        "sum_nll_ref": _f(a["nll_ref"].sum()),
        "sum_nll_cand": _f(a["nll_cand"].sum()),
        "sum_delta_p": _f(a["delta_p"].sum()),
        "sum_delta_p_sq": _f((a["delta_p"] ** 2).sum()),
        "max_kld": _f(a["kld"].max()) if len(s) else 0.0,
        "exceedance": exceedance_counts(a["kld"]),
        "histogram": LogHistogram.from_values(a["kld"]).to_json(),
        "diagnostics": diagnostic_totals(s),
    }


def merge_totals(parts: Sequence[Totals]) -> Totals:
    """Combine the totals of disjoint position sets (shards): sums add, max is the max, counts add."""
    if not parts:
        raise ValueError("merge_totals: nothing to merge")
    hist = LogHistogram.from_json(parts[0]["histogram"])
    for p in parts[1:]:
        hist = hist + LogHistogram.from_json(p["histogram"])
    diag = [p["diagnostics"] for p in parts if "diagnostics" in p]
    out: Totals = {
        "n_positions": int(sum(p["n_positions"] for p in parts)),
        "top1_count": int(sum(p["top1_count"] for p in parts)),
        "sum_kld": math.fsum(p["sum_kld"] for p in parts),
        "sum_jsd_bits": math.fsum(p["sum_jsd_bits"] for p in parts),
        "sum_ear": math.fsum(p["sum_ear"] for p in parts),
        "sum_nll_ref": math.fsum(p["sum_nll_ref"] for p in parts),
        "sum_nll_cand": math.fsum(p["sum_nll_cand"] for p in parts),
        "sum_delta_p": math.fsum(p["sum_delta_p"] for p in parts),
        "sum_delta_p_sq": math.fsum(p["sum_delta_p_sq"] for p in parts),
        "max_kld": max(p["max_kld"] for p in parts),
        "exceedance": {t: int(sum(p["exceedance"][t] for p in parts)) for t in parts[0]["exceedance"]},
        "histogram": hist.to_json(),
    }
    if len(diag) == len(parts):  # only when every part has them (reports written before lack the key)
        out["diagnostics"] = merge_diagnostic_totals(diag)
    return out


def headline_from_totals(t: Totals) -> TotalsMeans:
    """Means recomputed from totals (e.g. of merged shards)."""
    n = t["n_positions"]
    return {
        "kld_mean": t["sum_kld"] / n,
        "top1": t["top1_count"] / n,
        "ear_mean": t["sum_ear"] / n,
        "jsd_bits_mean": t["sum_jsd_bits"] / n,
        "ppl_ref": math.exp(t["sum_nll_ref"] / n),
        "ppl_cand": math.exp(t["sum_nll_cand"] / n),
    }


def _context_table(L: Layout, a: dict[str, np.ndarray]) -> tuple[list[ContextRow], dict[str, np.ndarray]]:
    nc = len(L.contexts)
    pos = np.bincount(L.ctx, minlength=nc).astype(np.int64)
    sums = {k: np.bincount(L.ctx, weights=v, minlength=nc) for k, v in a.items()}
    mx = np.full(nc, -np.inf)
    np.maximum.at(mx, L.ctx, a["kld"])
    rows: list[ContextRow] = []
    for i, c in enumerate(L.contexts):
        rows.append(
            {
                "index": int(c.index),
                "cluster": c.source_cluster if isinstance(c.source_cluster, (int, str)) else str(c.source_cluster),
                "stratum": c.stratum,
                "positions": int(pos[i]),
                "sum_kld": _f(sums["kld"][i]),
                "mean_kld": _f(sums["kld"][i] / pos[i]),
                "max_kld": _f(mx[i]),
                "top1": int(round(sums["top1"][i])),
                "sum_jsd_bits": _f(sums["jsd_bits"][i]),
                "sum_ear": _f(sums["ear"][i]),
                "sum_nll_ref": _f(sums["nll_ref"][i]),
                "sum_nll_cand": _f(sums["nll_cand"][i]),
                "sum_kld_rev": _f(sums["kld_rev"][i]),
                "top5_shared": int(round(sums["top5_shared"][i])),
                "top10_shared": int(round(sums["top10_shared"][i])),
            }
        )
    sums["positions"] = pos.astype(np.float64)
    return rows, sums


def _per_stratum(rows: list[ContextRow]) -> dict[str, StratumRow]:
    out: dict[str, StratumRow] = {}
    for r in rows:
        d = out.setdefault(r["stratum"], {"contexts": 0, "positions": 0, "sum_kld": 0.0, "top1_count": 0,
                                          "mean_kld": 0.0, "top1": 0.0})
        d["contexts"] += 1
        d["positions"] += r["positions"]
        d["sum_kld"] += r["sum_kld"]
        d["top1_count"] += r["top1"]
    for d in out.values():
        d["mean_kld"] = d["sum_kld"] / d["positions"]
        d["top1"] = d["top1_count"] / d["positions"]
    return dict(sorted(out.items()))


def _corr(x: np.ndarray, y: np.ndarray) -> float | None:
    if x.size < 2 or x.std() == 0 or y.std() == 0:
        return None
    return _f(np.corrcoef(x, y)[0, 1])


def context_rows(scores: PositionScores, context_index: np.ndarray, row: np.ndarray, contexts: Sequence[ContextLabel],
                 *, score_from: int = 0) -> list[ContextRow]:
    """The per-context rows :func:`summarize` reports (``contexts``), alone: what a receiver of positions and a
    report re-derives the report's rows from."""
    L = layout(scores, context_index, row, contexts, score_from)
    return _context_table(L, position_arrays(L.scores))[0]


def summarize(
    scores: PositionScores,
    context_index: np.ndarray,
    row: np.ndarray,
    contexts: Sequence[ContextLabel],
    *,
    score_from: int = 0,
    n_boot: int = DEFAULT_N_BOOT,
    n_boot_tails: int = DEFAULT_N_BOOT_TAILS,
    seed: int = DEFAULT_SEED,
) -> ShardSummary:
    """All per-report statistics as a JSON-ready dict (see the module docstring for each field)."""
    L = layout(scores, context_index, row, contexts, score_from)
    s = L.scores
    n = len(s)
    a = position_arrays(s)
    kld = a["kld"]
    rows, ctx_sums = _context_table(L, a)
    C = L.n_clusters
    cl_sums = {k: np.bincount(L.ctx_cluster, weights=v, minlength=C) for k, v in ctx_sums.items()}
    W = draw_cluster_weights(C, n_boot, seed)
    names = ("kld", "top1", "ear", "jsd_bits")
    ivs, reads = ratio_intervals_read(W, np.stack([cl_sums[k] for k in names], axis=1), cl_sums["positions"],
                                      bounds=(0.0, math.inf), right_skewed=RIGHT_SKEWED_MEANS)
    ci = {k: iv if (iv is None or k in ("kld", "jsd_bits")) else [iv[0], min(iv[1], 1.0)] for k, iv in zip(names, ivs)}
    diag = diagnostics_from_totals(diagnostic_totals(s), n, int(s.top1.sum()))
    dnames = ("kld_rev", "top5_shared", "top10_shared")
    div, dreads = ratio_intervals_read(W, np.stack([cl_sums[k] for k in dnames], axis=1), cl_sums["positions"],
                                       bounds=(0.0, math.inf), right_skewed=(True, False, False))
    diag["kld_rev"]["ci95"] = div[0]
    diag["top5_overlap"]["ci95"] = None if div[1] is None else [div[1][0] / 5, min(div[1][1] / 5, 1.0)]
    diag["top10_overlap"]["ci95"] = None if div[2] is None else [div[2][0] / 10, min(div[2][1] / 10, 1.0)]
    nt = min(n_boot_tails, n_boot)
    estimable = C >= MIN_CLUSTERS
    tail_estimable = C >= max(MIN_CLUSTERS, TAIL_MIN_CLUSTERS)
    if tail_estimable:
        q99_rep, cvar_rep = tail_replicates(TailData.build(kld, L.cluster, C), W[:nt], 0.99, 0.01)
    mean_ref, mean_cand = float(a["nll_ref"].mean()), float(a["nll_cand"].mean())
    dp = a["delta_p"]
    ctx_means = np.array([r["mean_kld"] for r in rows])
    worst = sorted(rows, key=lambda r: (-r["mean_kld"], r["index"]))[:N_WORST]
    return {
        "n_positions": n,
        "n_contexts": len(L.contexts),
        "n_clusters": C,
        "score_from": int(score_from),
        "bootstrap": {
            "method": MEAN_METHOD,
            "method_text": method_text(reads[:1], "the KLD"),
            "levels": {k: rd.to_json() for k, rd in zip(names + dnames, reads + dreads) if rd is not None},
            "level_guaranteed": not (reads[0] is not None and reads[0].dominated),
            "tail_method": TAIL_METHOD_TEXT,
            "level": LEVEL,
            "min_clusters": MIN_CLUSTERS,
            "estimable": estimable,
            "tail_min_clusters": TAIL_MIN_CLUSTERS,
            "tail_estimable": tail_estimable,
            "n_boot": int(n_boot),
            "n_boot_tails": int(nt),
            "seed": int(seed),
        },
        "kld": {
            "mean": _f(kld.mean()),
            "mean_context_macro": _f(ctx_means.mean()),
            "ci95": ci["kld"],
            "se_iid": _f(kld.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
            "median": quantile(kld, 0.5),
            "p95": quantile(kld, 0.95),
            "p99": quantile(kld, 0.99),
            "p999": quantile(kld, 0.999),
            "cvar1": cvar(kld, 0.01),
            "max": _f(kld.max()),
            "p99_ci95": percentile_interval(q99_rep, 1.0 - 2.0 * TAIL_ALPHA) if tail_estimable else None,
            "cvar1_ci95": percentile_interval(cvar_rep, 1.0 - 2.0 * TAIL_ALPHA) if tail_estimable else None,
        },
        "exceedance": exceedance_counts(kld),
        "histogram": LogHistogram.from_values(kld).to_json(),
        "top1": {"agreement": _f(a["top1"].mean()), "count": int(s.top1.sum()), "ci95": ci["top1"]},
        "ear": {"mean": _f(a["ear"].mean()), "ci95": ci["ear"]},
        "jsd_bits": {"mean": _f(a["jsd_bits"].mean()), "ci95": ci["jsd_bits"]},
        "ppl": {
            "ref": math.exp(mean_ref),
            "cand": math.exp(mean_cand),
            "ratio": math.exp(mean_cand - mean_ref),
            "mean_ln_ratio": _f((a["nll_cand"] - a["nll_ref"]).mean()),
            "corr_nll": _corr(a["nll_ref"], a["nll_cand"]),
        },
        "delta_p": {
            "mean": _f(dp.mean()),
            "std": _f(dp.std(ddof=1)) if n > 1 else 0.0,
            "rms": _f(math.sqrt(float((dp**2).mean()))),
            "min": _f(dp.min()),
            "max": _f(dp.max()),
            "percentiles": {f"p{p:02d}": quantile(dp, p / 100) for p in DELTA_P_PERCENTILES},
        },
        "per_stratum": _per_stratum(rows),
        "worst_contexts": worst,
        "contexts": rows,
        "totals": totals(s),
        "diagnostics": diag,
    }


__all__ = ["ContextLabel", "summarize", "totals", "merge_totals", "headline_from_totals", "position_arrays"]
