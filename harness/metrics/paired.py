"""Paired comparison of two candidates on the same positions (docs/design.md, section 2).

Differences are ``a - b`` (for KLD, p99 and CVaR1 negative means *a* is closer to the reference;
for top-1 and EAR positive means *a* is closer). Each interval applies the *same* cluster draws to
both candidates (common random numbers), so shared difficulty cancels and the interval is that of
the difference, not of two independent estimates. Two conversions whose KLD-difference interval
contains zero are practically equivalent on this suite.

Context wins are decided by each context's mean KLD: ``a_wins`` counts contexts where a's mean is
lower, ``b_wins`` where b's is lower, ``ties`` where they are equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.metrics.bootstrap import (
    DEFAULT_N_BOOT,
    DEFAULT_N_BOOT_TAILS,
    DEFAULT_SEED,
    LEVEL,
    TailData,
    draw_cluster_weights,
    percentile_interval,
    ratio_replicates,
    tail_replicates,
)
from harness.metrics.positions import ContextLabel, layout
from harness.metrics.tails import cvar, quantile
from harness.scoring.scores import PositionScores


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
) -> dict[str, Any]:
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

    out: dict[str, Any] = {
        "n_positions": len(La.scores),
        "n_contexts": nc,
        "n_clusters": C,
        "score_from": int(score_from),
        "bootstrap": {
            "method": "source-cluster bootstrap, common random numbers, percentile interval",
            "level": LEVEL,
            "n_boot": int(n_boot),
            "n_boot_tails": int(min(n_boot, n_boot_tails)),
            "seed": int(seed),
        },
        "difference": "a - b",
    }
    sa, sb = La.scores, Lb.scores
    for name, va, vb in (
        ("kld_mean", sa.kld, sb.kld),
        ("top1", sa.top1.astype(np.float64), sb.top1.astype(np.float64)),
        ("ear_mean", sa.ear, sb.ear),
    ):
        rep = ratio_replicates(W, cluster_sum(va), pos_cl) - ratio_replicates(W, cluster_sum(vb), pos_cl)
        out[name] = {
            "a": float(va.mean()),
            "b": float(vb.mean()),
            "diff": float(va.mean() - vb.mean()),
            "ci95": percentile_interval(rep),
        }
    nt = min(n_boot, n_boot_tails)
    qa, ca = tail_replicates(TailData.build(sa.kld, La.cluster, C), W[:nt])
    qb, cb = tail_replicates(TailData.build(sb.kld, Lb.cluster, C), W[:nt])
    for name, fa, fb, ra, rb in (
        ("kld_p99", quantile(sa.kld, 0.99), quantile(sb.kld, 0.99), qa, qb),
        ("kld_cvar1", cvar(sa.kld), cvar(sb.kld), ca, cb),
    ):
        out[name] = {"a": fa, "b": fb, "diff": fa - fb, "ci95": percentile_interval(ra - rb)}
    ma = np.bincount(La.ctx, weights=sa.kld, minlength=nc) / pos_ctx
    mb = np.bincount(Lb.ctx, weights=sb.kld, minlength=nc) / pos_ctx
    out["contexts"] = {
        "a_wins": int((ma < mb).sum()),
        "b_wins": int((mb < ma).sum()),
        "ties": int((ma == mb).sum()),
    }
    lo, hi = out["kld_mean"]["ci95"]
    out["kld_mean"]["interval_contains_zero"] = bool(lo <= 0.0 <= hi)
    return out
