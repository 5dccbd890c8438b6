"""Diagnostic scores beside the headline KLD: reverse KL, entropy, top-k overlap, KLD by confidence and entropy.

All of them come from per-position scores the scorer already computes from its logits tiles
(:class:`harness.metrics.scores.PositionScores`); none needs another GEMM.

Reasoning: docs/design.md §"The diagnostics block".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from harness.metrics.records import (
    BucketRow,
    DecileRow,
    Diagnostics,
    DiagnosticTotals,
    EntropyBins,
    EntropySpec,
)
from harness.metrics.scores import PositionScores

#: Edges of the reference-confidence buckets (the reference's top probability); the last bucket is closed at 1.
CONFIDENCE_EDGES: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
#: The fixed fine histogram of the reference entropy (nats) that the deciles are formed from.
ENTROPY_SPEC: EntropySpec = {"kind": "log10", "lo": 1e-6, "hi": 100.0, "bins_per_decade": 40, "n_counts": 322}


def _entropy_edges(spec: EntropySpec) -> np.ndarray:
    """Inner edges lo … hi (``n_counts - 1`` values); bin 0 is [0, lo), the last bin [hi, ∞)."""
    decades = round(math.log10(spec["hi"] / spec["lo"]))
    n = decades * spec["bins_per_decade"]
    if n + 2 != spec["n_counts"]:
        raise ValueError(f"entropy spec: expected n_counts {n + 2}, found {spec['n_counts']}")
    edges: np.ndarray = spec["lo"] * 10.0 ** (np.arange(n + 1) / spec["bins_per_decade"])
    return edges


def _entropy_bin(h: np.ndarray, spec: EntropySpec) -> np.ndarray:
    idx: np.ndarray = np.searchsorted(_entropy_edges(spec), h, side="right")
    return idx


def confidence_bucket(p_top: np.ndarray) -> np.ndarray:
    """Bucket index of each reference top probability (``CONFIDENCE_EDGES``; 1.0 falls in the last bucket)."""
    k = len(CONFIDENCE_EDGES) - 1
    idx: np.ndarray = np.clip(np.searchsorted(np.asarray(CONFIDENCE_EDGES), p_top, side="right") - 1, 0, k - 1)
    return idx


def diagnostic_totals(s: PositionScores) -> DiagnosticTotals:
    """Additive diagnostic sums of a set of positions (merge with :func:`merge_diagnostic_totals`)."""
    kb = len(CONFIDENCE_EDGES) - 1
    cb = confidence_bucket(s.p_ref_top)
    eb = _entropy_bin(s.entropy_ref, ENTROPY_SPEC)
    ne = ENTROPY_SPEC["n_counts"]
    return {
        "sum_kld_rev": float(s.kld_rev.sum()),
        "sum_entropy_ref": float(s.entropy_ref.sum()),
        "sum_p_ref_top": float(s.p_ref_top.sum()),
        "sum_q_ref_top": float(s.q_ref_top.sum()),
        "top5_shared": int(s.top5_overlap.sum()),
        "top10_shared": int(s.top10_overlap.sum()),
        "by_confidence": {
            "edges": list(CONFIDENCE_EDGES),
            "counts": [int(x) for x in np.bincount(cb, minlength=kb)],
            "sum_kld": [float(x) for x in np.bincount(cb, weights=s.kld, minlength=kb)],
            "top1_count": [int(x) for x in np.bincount(cb, weights=s.top1.astype(np.float64), minlength=kb).round()],
        },
        "by_entropy": {
            "spec": dict(ENTROPY_SPEC),  # type: ignore[typeddict-item]
            "counts": [int(x) for x in np.bincount(eb, minlength=ne)],
            "sum_kld": [float(x) for x in np.bincount(eb, weights=s.kld, minlength=ne)],
        },
    }


def merge_diagnostic_totals(parts: Sequence[DiagnosticTotals]) -> DiagnosticTotals:
    """Combine the diagnostic totals of disjoint position sets (shards): everything adds."""
    if not parts:
        raise ValueError("merge_diagnostic_totals: nothing to merge")
    first = parts[0]
    for p in parts[1:]:
        if p["by_confidence"]["edges"] != first["by_confidence"]["edges"] or p["by_entropy"]["spec"] != first["by_entropy"]["spec"]:
            raise ValueError("merge_diagnostic_totals: bucket edges differ between the parts")

    def add_f(key: str, sub: str) -> list[float]:
        return [math.fsum(v) for v in zip(*(p[key][sub] for p in parts))]  # type: ignore[literal-required]

    def add_i(key: str, sub: str) -> list[int]:
        return [int(sum(v)) for v in zip(*(p[key][sub] for p in parts))]  # type: ignore[literal-required]

    return {
        "sum_kld_rev": math.fsum(p["sum_kld_rev"] for p in parts),
        "sum_entropy_ref": math.fsum(p["sum_entropy_ref"] for p in parts),
        "sum_p_ref_top": math.fsum(p["sum_p_ref_top"] for p in parts),
        "sum_q_ref_top": math.fsum(p["sum_q_ref_top"] for p in parts),
        "top5_shared": int(sum(p["top5_shared"] for p in parts)),
        "top10_shared": int(sum(p["top10_shared"] for p in parts)),
        "by_confidence": {"edges": list(first["by_confidence"]["edges"]), "counts": add_i("by_confidence", "counts"),
                          "sum_kld": add_f("by_confidence", "sum_kld"), "top1_count": add_i("by_confidence", "top1_count")},
        "by_entropy": {"spec": first["by_entropy"]["spec"], "counts": add_i("by_entropy", "counts"),
                       "sum_kld": add_f("by_entropy", "sum_kld")},
    }


def entropy_deciles(bins: EntropyBins) -> list[DecileRow]:
    """Deciles of the reference entropy formed from the fixed fine histogram (docs/design.md §"The diagnostics block")."""
    counts = np.asarray(bins["counts"], dtype=np.int64)
    sums = np.asarray(bins["sum_kld"], dtype=np.float64)
    n = int(counts.sum())
    if n == 0:
        return []
    inner = _entropy_edges(bins["spec"])
    lo_edges = np.concatenate([[0.0], inner])
    hi_edges = np.concatenate([inner, [math.inf]])
    below = np.cumsum(counts) - counts
    middle = below + counts / 2.0
    group = np.clip(np.floor(10.0 * middle / n), 0, 9).astype(np.int64)
    rows: list[DecileRow] = []
    for g in range(10):
        sel = (group == g) & (counts > 0)
        if not sel.any():
            continue
        idx = np.flatnonzero(sel)
        c = int(counts[idx].sum())
        hi = float(hi_edges[idx[-1]])
        rows.append({"decile": g + 1, "lo": float(lo_edges[idx[0]]), "hi": hi if math.isfinite(hi) else None,
                     "positions": c, "mean_kld": math.fsum(sums[idx]) / c})
    return rows


def confidence_rows(t: DiagnosticTotals) -> list[BucketRow]:
    """One row per non-empty reference-confidence bucket."""
    b = t["by_confidence"]
    e = b["edges"]
    return [{"lo": e[i], "hi": e[i + 1], "positions": c, "mean_kld": b["sum_kld"][i] / c, "top1": b["top1_count"][i] / c}
            for i, c in enumerate(b["counts"]) if c > 0]


def diagnostics_from_totals(t: DiagnosticTotals, n_positions: int, top1_count: int) -> Diagnostics:
    """Means and tables from (merged) diagnostic totals; intervals are added by the caller where it has clusters."""
    n = n_positions
    st = top1_count / n
    return {
        "kld_rev": {"mean": t["sum_kld_rev"] / n, "ci95": None},
        "entropy_ref_mean": t["sum_entropy_ref"] / n,
        "p_ref_top_mean": t["sum_p_ref_top"] / n,
        "q_ref_top_mean": t["sum_q_ref_top"] / n,
        "top5_overlap": {"mean": t["top5_shared"] / (5 * n), "ci95": None},
        "top10_overlap": {"mean": t["top10_shared"] / (10 * n), "ci95": None},
        "same_top": {"fraction": st, "se_iid": math.sqrt(st * (1.0 - st) / (n - 1)) if n > 1 else None},
        "by_confidence": confidence_rows(t),
        "by_entropy_decile": entropy_deciles(t["by_entropy"]),
    }


__all__ = [
    "CONFIDENCE_EDGES",
    "ENTROPY_SPEC",
    "confidence_bucket",
    "confidence_rows",
    "diagnostic_totals",
    "diagnostics_from_totals",
    "entropy_deciles",
    "merge_diagnostic_totals",
]
