"""The adaptive ladder's stopping rule (harness.gate.adaptive): each side's error rate in simulation, and the monitor.

The rows go through ``decide`` exactly as the monitor's do. The ``slow`` tier
(``tests/test_coverage.py``) repeats this with many more data sets at 16, 47 and ~800 clusters.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.gate.adaptive import (
    ALPHA_SIDE,
    MIN_EARLY_CLUSTERS,
    AdaptiveMonitor,
    alpha_per_look,
    cluster_totals,
    decide,
    look_bounds,
    render_adaptive,
    side_of,
)
from harness.metrics.simulation import HEAVY

K = 4  # planned shards (looks)
CLUSTERS_PER_SHARD = 24  # 48 clusters after look 2: looks 2 and 3 may stop
POSITIONS = 31


def _shard_rows(rng: np.random.Generator, shard: int, mean: float) -> list[dict]:
    """Per-context rows of one synthetic shard: one context per cluster, per-cluster mean KLD from the
    skewed heavy-tailed model (lognormal cluster effects), with expectation ``mean``."""
    m = HEAVY.cluster_multipliers(rng, (CLUSTERS_PER_SHARD,)) * HEAVY.context_means(rng, (CLUSTERS_PER_SHARD,)) * mean
    return [{"cluster": f"s{shard}c{c}", "positions": POSITIONS, "sum_kld": float(m[c]) * POSITIONS}
            for c in range(CLUSTERS_PER_SHARD)]


def _run(rng: np.random.Generator, true_mean: float, threshold: float) -> str | None:
    rows: list[dict] = []
    first = None
    for k in range(1, K + 1):
        rows += _shard_rows(rng, k, true_mean)
        d = decide(rows, k, K, threshold, first_look=first, n_boot=400, seed=1000 + k)
        if d.clusters >= MIN_EARLY_CLUSTERS and first is None:
            first = k
        if d.stop:
            return d.side
    return None


def _sides(rng: np.random.Generator, reps: int, true_mean: float, threshold: float, through_decide: int) -> list[str | None]:
    """:func:`_run` of ``reps`` data sets, their looks taken together: at a look every data set has the same
    clusters and seed, so one bootstrap draw serves all (``look_bounds`` of sums ``[C, reps]``). The first
    ``through_decide`` data sets also go through ``decide`` row by row, look by look, and must stop alike."""
    m = HEAVY.cluster_multipliers(rng, (reps, K, CLUSTERS_PER_SHARD)) * HEAVY.context_means(rng, (reps, K, CLUSTERS_PER_SHARD))
    rows = [[[{"cluster": f"s{k}c{c}", "positions": POSITIONS, "sum_kld": float(m[r, k - 1, c] * true_mean) * POSITIONS}
              for c in range(CLUSTERS_PER_SHARD)] for k in range(1, K + 1)] for r in range(reps)]
    first = next(k for k in range(1, K + 1) if k * CLUSTERS_PER_SHARD >= MIN_EARLY_CLUSTERS)
    sides: list[str | None] = [None] * reps
    for k in range(first, K):  # the looks that may stop
        looked = [[row for shard in rows[r][:k] for row in shard] for r in range(reps)]
        totals = [cluster_totals(rs) for rs in looked]  # decide's per-cluster sums, in its cluster order
        sums, counts = np.stack([t[0] for t in totals], axis=1), totals[0][1]
        bounds = look_bounds(sums, counts, alpha_per_look(K, first), 400, 1000 + k)
        for r in range(reps):
            if sides[r] is None:
                sides[r] = side_of(float(bounds[r, 0]), float(bounds[r, 1]), threshold)
    for r in range(through_decide):
        shards = rows[r]
        seen: list[dict] = []
        side = None
        for k in range(1, K + 1):
            seen += shards[k - 1]
            d = decide(seen, k, K, threshold, first_look=first if k >= first else None, n_boot=400, seed=1000 + k)
            if d.stop:
                side = d.side
                break
        assert side == sides[r], (r, side, sides[r])
    return sides


@pytest.mark.slow
def test_each_side_error_rate_at_the_boundary() -> None:
    """True mean exactly at the threshold (the worst case): an early pass and an early fail are both
    errors, each bounded by ALPHA_SIDE; counted separately."""
    rng = np.random.default_rng(7)
    reps = 300
    sides = _sides(rng, reps, 1e-3, 1e-3, through_decide=20)
    wrong_pass, wrong_fail = sides.count("below") / reps, sides.count("above") / reps
    # 300 repeats: a true 2.5 % gives at most 13 stops (4.3 %) with probability > 0.99
    assert wrong_pass <= ALPHA_SIDE + 0.02, f"early wrong-pass rate {wrong_pass:.3f} > {ALPHA_SIDE} + 0.02"
    assert wrong_fail <= ALPHA_SIDE + 0.02, f"early wrong-fail rate {wrong_fail:.3f} > {ALPHA_SIDE} + 0.02"


def test_clear_candidates_stop_early_on_the_right_side() -> None:
    rng = np.random.default_rng(8)
    good = [_run(rng, 0.3e-3, 1e-3) for _ in range(30)]
    bad = [_run(rng, 3e-3, 1e-3) for _ in range(30)]
    assert good.count("below") >= 27 and "above" not in good
    assert bad.count("above") >= 27 and "below" not in bad


def test_whole_budget_over_the_looks_that_may_stop() -> None:
    assert alpha_per_look(6, 3) == ALPHA_SIDE / 3  # looks 3, 4, 5 may stop; look 6 is the last
    assert alpha_per_look(6, 1) == ALPHA_SIDE / 5
    assert alpha_per_look(6, 6) is None and alpha_per_look(6, None) is None


def test_no_early_stop_below_the_minimum_clusters_or_at_the_last_look() -> None:
    rng = np.random.default_rng(9)
    rows = _shard_rows(rng, 0, 1e-3)
    d = decide(rows, 1, K, 1.0)  # 24 clusters, far below the threshold: still no stop
    assert d.clusters == CLUSTERS_PER_SHARD < MIN_EARLY_CLUSTERS and not d.stop and d.ci is None
    rows += _shard_rows(rng, 1, 1e-3)
    assert not decide(rows, 2, 2, 1.0).stop  # the last look: nothing left to skip


def test_monitor_stops_and_records() -> None:
    rng = np.random.default_rng(10)
    mon = AdaptiveMonitor(planned={"x": [0, 1, 2, 3]}, thresholds={"x": 1.0})
    d1 = mon.observe("x", 0, {"contexts": _shard_rows(rng, 0, 1e-3), "bootstrap": {"seed": 1}})
    assert not d1.stop and mon.stop_reason("x") is None
    d2 = mon.observe("x", 1, {"contexts": _shard_rows(rng, 1, 1e-3), "bootstrap": {"seed": 1}})
    assert d2.side == "below" and d2.stop and d2.alpha_k == ALPHA_SIDE / 2 and d2.level == 1 - ALPHA_SIDE
    assert d2.ci is not None and d2.ci[1] < 1.0
    reason = mon.stop_reason("x")
    assert reason is not None and "x passes" in reason and "look 2/4" in reason
    md = render_adaptive([{"candidate": "x", "shard": i, **d.record()} for i, d in enumerate((d1, d2))])
    assert "may not stop at this look" in md and "stop: passes" in md
    assert AdaptiveMonitor(planned={"y": [0, 1]}, thresholds={"y": None}).observe("y", 0, {"contexts": _shard_rows(rng, 0, 1e-3)}).side is None
