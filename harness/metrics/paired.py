"""Paired comparison of two candidates on the same positions (docs/design.md, section 2).

Reasoning: docs/statistics.md §"The paired difference".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from harness.metrics.bootstrap import (
    DEFAULT_N_BOOT,
    DEFAULT_N_BOOT_TAILS,
    DEFAULT_SEED,
    DIFF_METHOD_TEXT,
    LEVEL,
    MEAN_METHOD,
    MIN_CLUSTERS,
    TAIL_ALPHA,
    TAIL_METHOD_TEXT,
    TAIL_MIN_CLUSTERS,
    TailData,
    draw_cluster_weights,
    percentile_interval,
    ratio_intervals,
    tail_replicates,
)
from harness.metrics.positions import ContextLabel, layout
from harness.metrics.scores import PositionScores
from harness.metrics.tails import cvar, quantile


class PairedBootstrap(TypedDict):
    """How a paired comparison's intervals were drawn (common random numbers: the same draws for a and b)."""

    method: str
    method_text: str
    tail_method: str
    level: float
    min_clusters: int
    estimable: bool
    tail_estimable: bool
    tail_min_clusters: int
    n_boot: int
    n_boot_tails: int
    seed: int


class Difference(TypedDict):
    """One statistic of both candidates and their difference ``a - b`` with its 95% interval (None: not estimable)."""

    a: float
    b: float
    diff: float
    ci95: list[float] | None


class MeanDifference(Difference):
    """The mean-KLD difference, and whether its interval contains 0 (None: not estimable)."""

    interval_contains_zero: bool | None


class ContextWins(TypedDict):
    """Contexts where a's mean KLD is lower, where b's is, and ties."""

    a_wins: int
    b_wins: int
    ties: int


class PairedStats(TypedDict):
    """What :func:`paired` returns: the differences a - b and how they were drawn."""

    n_positions: int
    n_contexts: int
    n_clusters: int
    score_from: int
    bootstrap: PairedBootstrap
    difference: str
    kld_mean: MeanDifference
    top1: Difference
    ear_mean: Difference
    kld_p99: Difference
    kld_cvar1: Difference
    contexts: ContextWins


def paired(
    scores_a: PositionScores,
    scores_b: PositionScores,
    context_index: np.ndarray,
    row: np.ndarray,
    contexts: Sequence[ContextLabel],
    *,
    score_from: int = 0,
    n_boot: int = DEFAULT_N_BOOT,
    n_boot_tails: int = DEFAULT_N_BOOT_TAILS,
    seed: int = DEFAULT_SEED,
) -> PairedStats:
    """Differences a - b of mean KLD, p99, CVaR1, top-1 and EAR with common-random-number cluster intervals."""
    if len(scores_a) != len(scores_b):
        raise ValueError(f"paired: expected the same positions, found {len(scores_a)} and {len(scores_b)} positions")
    La = layout(scores_a, context_index, row, contexts, score_from)
    Lb = layout(scores_b, context_index, row, contexts, score_from)
    C = La.n_clusters
    nc = len(La.contexts)
    W = draw_cluster_weights(C, n_boot, seed)
    pos_ctx = np.bincount(La.ctx, minlength=nc).astype(np.float64)
    pos_cl = np.bincount(La.ctx_cluster, weights=pos_ctx, minlength=C)

    def cluster_sum(values: np.ndarray) -> np.ndarray:
        return np.bincount(La.cluster, weights=values, minlength=C)

    bootstrap: PairedBootstrap = {
            "method": MEAN_METHOD,
            "method_text": DIFF_METHOD_TEXT + ", common random numbers (the same draws for a and b)",
            "tail_method": TAIL_METHOD_TEXT + ", common random numbers",
            "level": LEVEL,
            "min_clusters": MIN_CLUSTERS,
            "estimable": C >= MIN_CLUSTERS,
            "tail_estimable": C >= max(MIN_CLUSTERS, TAIL_MIN_CLUSTERS),
            "tail_min_clusters": TAIL_MIN_CLUSTERS,
            "n_boot": int(n_boot),
            "n_boot_tails": int(min(n_boot, n_boot_tails)),
            "seed": int(seed),
    }
    sa, sb = La.scores, Lb.scores

    def mean_difference(va: np.ndarray, vb: np.ndarray) -> Difference:
        return {"a": float(va.mean()), "b": float(vb.mean()), "diff": float(va.mean() - vb.mean()),
                "ci95": ratio_intervals(W, cluster_sum(va) - cluster_sum(vb), pos_cl)[0]}

    kld = mean_difference(sa.kld, sb.kld)
    top1 = mean_difference(sa.top1.astype(np.float64), sb.top1.astype(np.float64))
    ear = mean_difference(sa.ear, sb.ear)
    nt = min(n_boot, n_boot_tails)
    tail_pairs = {"kld_p99": (quantile(sa.kld, 0.99), quantile(sb.kld, 0.99)), "kld_cvar1": (cvar(sa.kld), cvar(sb.kld))}
    tail_ci: dict[str, list[float] | None] = {"kld_p99": None, "kld_cvar1": None}
    if C >= max(MIN_CLUSTERS, TAIL_MIN_CLUSTERS):
        qa, ca = tail_replicates(TailData.build(sa.kld, La.cluster, C), W[:nt])
        qb, cb = tail_replicates(TailData.build(sb.kld, Lb.cluster, C), W[:nt])
        level = 1.0 - 2.0 * TAIL_ALPHA
        tail_ci = {"kld_p99": percentile_interval(qa - qb, level), "kld_cvar1": percentile_interval(ca - cb, level)}
    tails: dict[str, Difference] = {name: {"a": fa, "b": fb, "diff": fa - fb, "ci95": tail_ci[name]}
                                    for name, (fa, fb) in tail_pairs.items()}
    ma = np.bincount(La.ctx, weights=sa.kld, minlength=nc) / pos_ctx
    mb = np.bincount(Lb.ctx, weights=sb.kld, minlength=nc) / pos_ctx
    ci = kld["ci95"]
    return {
        "n_positions": len(La.scores),
        "n_contexts": nc,
        "n_clusters": C,
        "score_from": int(score_from),
        "bootstrap": bootstrap,
        "difference": "a - b",
        "kld_mean": {**kld, "interval_contains_zero": None if ci is None else bool(ci[0] <= 0.0 <= ci[1])},
        "top1": top1,
        "ear_mean": ear,
        "kld_p99": tails["kld_p99"],
        "kld_cvar1": tails["kld_cvar1"],
        "contexts": {"a_wins": int((ma < mb).sum()), "b_wins": int((mb < ma).sum()), "ties": int((ma == mb).sum())},
    }
