"""The adaptive ladder's stopping rule (harness.gate.adaptive): error rate in simulation, and the monitor."""

from __future__ import annotations

import numpy as np
import pytest

from harness.gate.adaptive import ALPHA, AdaptiveMonitor, decide

K = 4  # planned shards (looks)
CLUSTERS_PER_SHARD = 16
POSITIONS = 31


def _shard_rows(rng: np.random.Generator, shard: int, mean: float) -> list[dict]:
    """Per-context rows of one synthetic shard: one context per cluster, per-cluster mean KLD
    gamma-distributed (skewed, like real KLD) with expectation ``mean``."""
    rows = []
    for c in range(CLUSTERS_PER_SHARD):
        m = rng.gamma(2.0, mean / 2.0)
        rows.append({"cluster": f"s{shard}c{c}", "positions": POSITIONS, "sum_kld": m * POSITIONS})
    return rows


def _run(rng: np.random.Generator, true_mean: float, threshold: float, alpha: float, looks: int) -> str | None:
    rows: list[dict] = []
    for k in range(1, K + 1):
        rows += _shard_rows(rng, k, true_mean)
        d = decide(rows, k, looks, threshold, alpha=alpha, n_boot=400, seed=1000 + k)
        if d.stop:
            return d.side
    return None


@pytest.mark.slow
def test_error_rate_at_the_boundary_is_within_nominal() -> None:
    """True mean exactly at the threshold (the worst case): any early stop is an error."""
    rng = np.random.default_rng(7)
    reps = 300
    stops = sum(_run(rng, 1e-3, 1e-3, ALPHA, K) is not None for _ in range(reps))
    assert stops / reps <= ALPHA + 0.03, f"adaptive error rate {stops / reps:.3f} > {ALPHA} + 0.03"


def test_clear_candidates_stop_early_on_the_right_side() -> None:
    rng = np.random.default_rng(8)
    good = [_run(rng, 0.5e-3, 1e-3, ALPHA, K) for _ in range(30)]
    bad = [_run(rng, 2e-3, 1e-3, ALPHA, K) for _ in range(30)]
    assert good.count("below") >= 27 and "above" not in good
    assert bad.count("above") >= 27 and "below" not in bad


def test_last_look_never_stops_and_monitor_records() -> None:
    rng = np.random.default_rng(9)
    rows = _shard_rows(rng, 0, 1e-3)
    assert not decide(rows, 1, 1, 1.0).stop  # a single planned shard: nothing left to skip
    mon = AdaptiveMonitor(planned={"x": [0, 1, 2, 3]}, thresholds={"x": 1.0})
    d = mon.observe("x", 0, {"contexts": rows, "bootstrap": {"seed": 1}})
    assert d.side == "below" and d.stop and d.level == 1 - ALPHA / 4
    reason = mon.stop_reason("x")
    assert reason is not None and "x passes" in reason and "look 1/4" in reason
    assert AdaptiveMonitor(planned={"y": [0, 1]}, thresholds={"y": None}).observe("y", 0, {"contexts": rows}).side is None
