"""``fidelity plan``: planned versus simulated coverage and power, resampling the fixture suite's clusters.

Pilot: per-context KLD rows of the fixture int4_g32 candidate and of the same candidate with layer 3
restored (a second, real candidate on the same positions), shards 0-2 of the fixture suite, scored
in-process (:mod:`harness.attribution.ablation`). The simulation draws C clusters with replacement
from the pilot's clusters (shifted so the true difference is the planned delta) and applies the
cluster t-test / interval the planner models; the power at the planned delta is that of the harness's own paired
interval (``ratio_intervals``, each side read at its level).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from harness.metrics.bootstrap import DEFAULT_N_BOOT, DEFAULT_SEED, draw_cluster_weights, ratio_intervals
from harness.planning.design import (
    ClusterPilot,
    achievable_eps,
    clusters_for_difference,
    clusters_for_precision,
    power_at,
    resolvable_delta,
)

pytestmark = pytest.mark.slow  # captures the fixture model in-process

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pilot_rows() -> tuple[list[dict], list[dict]]:
    import torch

    from harness.attribution.ablation import capture_reference, load_models, score_variant
    from harness.inputs.suite import Suite

    torch.set_num_threads(2)
    suite = Suite.load(ROOT / "fixtures" / "suite")
    idx = suite.context_indices([0, 1, 2])
    tokens = np.asarray(suite.tokens[idx])
    models = load_models(ROOT / "fixtures" / "model", ROOT / "fixtures" / "candidates" / "int4_g32")
    ref = capture_reference(models, tokens)
    a = score_variant(models, ref, tokens, [])
    b = score_variant(models, ref, tokens, [p for p in models.params if ".layers.3." in p])

    def rows(k: np.ndarray) -> list[dict]:
        return [{"index": i, "cluster": suite.contexts[i].source_cluster, "positions": suite.n_ctx - 1, "sum_kld": float(s)}
                for i, s in zip(idx, k)]

    return rows(a.sum_kld), rows(b.sum_kld)


def _simulate(p: ClusterPilot, clusters: int, target: float, reps: int, seed: int) -> np.ndarray:
    """Cluster-resampled estimates and cluster-robust SEs of the ratio mean, population mean set to ``target``."""
    rng = np.random.default_rng(seed)
    s = p.sums - p.mean * p.positions + target * p.positions
    pick = rng.integers(0, p.n_clusters, size=(reps, clusters))
    S, N = s[pick], p.positions[pick]
    r = S.sum(1) / N.sum(1)
    e = S - r[:, None] * N
    se = np.sqrt((e**2).sum(1) / (clusters - 1)) / N.mean(1) / np.sqrt(clusters)  # the planner's se, per draw
    return np.stack([r, se])


def test_planned_power_matches_simulation(pilot_rows: tuple[list[dict], list[dict]]) -> None:
    a, b = pilot_rows
    p = ClusterPilot.from_rows(a, b)
    assert p.n_clusters >= 15
    clusters = p.n_clusters  # one harness interval per resampled suite (their cluster sizes differ): 250 suites
    delta = math.copysign(resolvable_delta(p, clusters), p.mean)
    planned = power_at(p, delta, clusters)
    assert planned == pytest.approx(0.80, abs=0.01)
    # resampled suites at the true difference delta: the harness's paired interval excludes 0 on delta's side
    rng = np.random.default_rng(clusters)
    s = p.sums - p.mean * p.positions + delta * p.positions
    W = draw_cluster_weights(clusters, DEFAULT_N_BOOT, DEFAULT_SEED)
    hits = []
    for pick in rng.integers(0, p.n_clusters, size=(250, clusters)):
        lo, hi = ratio_intervals(W, s[pick], p.positions[pick])[0] or (0.0, 0.0)
        hits.append(lo > 0.0 if delta > 0 else hi < 0.0)
    simulated = float(np.mean(hits))
    print(f"{clusters} clusters: planned power {planned:.3f}, simulated {simulated:.3f} (250 suites)")
    assert abs(simulated - planned) <= 0.08, (clusters, planned, simulated)
    # the planner's cluster count for that delta reaches the planned power
    c = clusters_for_difference(p, resolvable_delta(p, 40))
    assert c == 40


def test_planned_precision_coverage(pilot_rows: tuple[list[dict], list[dict]]) -> None:
    a, _ = pilot_rows
    p = ClusterPilot.from_rows(a)
    eps = 0.03
    c = clusters_for_precision(p, eps)
    assert achievable_eps(p, c) <= eps < achievable_eps(p, c - 1)
    r, _se = _simulate(p, c, p.mean, reps=4000, seed=1)
    coverage = float(np.mean(np.abs(r - p.mean) <= eps * p.mean))
    assert coverage >= 0.95 - 0.05, coverage


def test_pilot_sigma_against_direct_formula(pilot_rows: tuple[list[dict], list[dict]]) -> None:
    a, _ = pilot_rows
    clusters: dict[str, list[float]] = {}
    for r in a:
        clusters.setdefault(str(r["cluster"]), [0.0, 0.0])
        clusters[str(r["cluster"])][0] += r["sum_kld"]
        clusters[str(r["cluster"])][1] += r["positions"]
    s = np.array([v[0] for v in clusters.values()])
    n = np.array([v[1] for v in clusters.values()])
    mean = s.sum() / n.sum()
    se = np.sqrt(((s - mean * n) ** 2).sum() / (len(s) - 1)) / n.mean() / np.sqrt(len(s))
    p = ClusterPilot.from_rows(a)
    assert p.mean == pytest.approx(mean, rel=1e-12)
    assert p.se(p.n_clusters) == pytest.approx(se, rel=1e-12)
