"""Seeded synthetic per-cluster KLD data for the coverage and error-rate simulations.

Used by the ``slow`` test tier (``tests/test_coverage.py``) and by ``benchmarks/coverage_table.py``
(the table in ``docs/statistics.md``). Only what the interval methods see is simulated: per source
cluster the sum of the per-position KLD and the number of positions.

Reasoning: docs/statistics.md §"The simulation model".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.metrics.bootstrap import effective_clusters, extended_weights


@dataclass(frozen=True)
class ClusterModel:
    """A synthetic per-position KLD model (each field's meaning: docs/statistics.md §"The simulation model")."""

    name: str
    sigma_cluster: float
    sigma_context: float
    sigma_position: float
    cluster_law: str = "lognormal"
    pareto_shape: float = 2.5
    hard_fraction: float = 0.05
    hard_ratio: float = 20.0
    positions: int = 255
    mean: float = 1e-3

    def _unit_lognormal(self, rng: np.random.Generator, sigma: float, size: tuple[int, ...]) -> np.ndarray:
        if sigma == 0.0:
            return np.ones(size)
        return rng.lognormal(-0.5 * sigma * sigma, sigma, size)

    def cluster_multipliers(self, rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
        """Cluster effects with expectation 1."""
        if self.cluster_law == "pareto":
            a = self.pareto_shape
            return np.asarray(rng.pareto(a, size) * (a - 1.0), dtype=np.float64)  # Lomax(a) has mean 1/(a-1)
        if self.cluster_law == "mixture":
            hard = 1.0 + (self.hard_ratio - 1.0) * (rng.random(size) < self.hard_fraction)
            scale = 1.0 + (self.hard_ratio - 1.0) * self.hard_fraction
            return np.asarray(self._unit_lognormal(rng, self.sigma_cluster, size) * hard / scale, dtype=np.float64)
        if self.cluster_law != "lognormal":
            raise ValueError(f"cluster_law: expected 'lognormal', 'pareto' or 'mixture', found {self.cluster_law!r}")
        return self._unit_lognormal(rng, self.sigma_cluster, size)

    def context_means(self, rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
        """Mean of ``positions`` unit-mean lognormal position values (moment-matched lognormal)."""
        cv2 = math.expm1(self.sigma_position**2) / self.positions
        return self._unit_lognormal(rng, math.sqrt(math.log1p(cv2)), size)

    def draw_contexts(self, rng: np.random.Generator, reps: int, n_clusters: int, contexts_per_cluster: int) -> np.ndarray:
        """``reps`` data sets: per-context KLD sums ``[n_clusters, contexts_per_cluster, reps]``."""
        k = contexts_per_cluster
        u = self.cluster_multipliers(rng, (n_clusters, 1, reps))
        ctx = self._unit_lognormal(rng, self.sigma_context, (n_clusters, k, reps)) * self.context_means(rng, (n_clusters, k, reps))
        return np.asarray(self.mean * self.positions * u * ctx, dtype=np.float64)

    def draw(self, rng: np.random.Generator, reps: int, n_clusters: int, contexts_per_cluster: int) -> tuple[np.ndarray, np.ndarray]:
        """``reps`` data sets: per-cluster KLD sums ``[n_clusters, reps]`` and positions ``[n_clusters]``."""
        sums = self.draw_contexts(rng, reps, n_clusters, contexts_per_cluster).sum(axis=1)
        return sums, np.full(n_clusters, float(self.positions * contexts_per_cluster))

    def draw_paired(
        self, rng: np.random.Generator, reps: int, n_clusters: int, contexts_per_cluster: int, rel_diff: float,
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Two candidates on the same positions: per-cluster sums of the KLD difference ``a - b``
        ``[n_clusters, reps]``, positions ``[n_clusters]`` and the true mean difference.

        Both share the cluster and context multipliers (difficulty); their position noise is
        independent; ``a``'s mean is ``(1 + rel_diff)`` times ``b``'s, so the true difference is
        ``rel_diff * mean``."""
        k = contexts_per_cluster
        shape = (n_clusters, k, reps)
        common = self.cluster_multipliers(rng, (n_clusters, 1, reps)) * self._unit_lognormal(rng, self.sigma_context, shape)
        a = (1.0 + rel_diff) * common * self.context_means(rng, shape)
        b = common * self.context_means(rng, shape)
        diff = (self.mean * self.positions * (a - b)).sum(axis=1)
        return diff, np.full(n_clusters, float(self.positions * k)), rel_diff * self.mean


FIXTURE = ClusterModel("fixture-fitted", sigma_cluster=0.10, sigma_context=0.08, sigma_position=0.9)
HEAVY = ClusterModel("heavy-tailed", sigma_cluster=0.6, sigma_context=0.3, sigma_position=1.5)
EXTREME = ClusterModel("extreme (Pareto 2.5 clusters)", sigma_cluster=0.0, sigma_context=0.5, sigma_position=2.0,
                       cluster_law="pareto", pareto_shape=2.5)
#: The models the ``slow`` tier asserts on, and the one beyond what 16 clusters can cover (documented).
MODELS = (FIXTURE, HEAVY)
ALL_MODELS = (FIXTURE, HEAVY, EXTREME)

#: (clusters, contexts per cluster) of the cluster counts the harness gates on: the fewest a shard may
#: have for an interval (8), one shard of the embedded default (16), its whole ladder (47 clusters, 96
#: contexts), a larger ladder (85), and the seed suite (842 clusters, 5,120 contexts).
LAYOUTS = ((8, 1), (16, 1), (47, 2), (85, 2), (842, 6))


def previous_rule_intervals(weights: np.ndarray, sums: np.ndarray, counts: np.ndarray, alpha: float = 0.025) -> tuple[np.ndarray, np.ndarray]:
    """The mean interval of the harness's previous rule, and the percentile interval, of every data set (column of
    ``sums`` [C, R]) on the same draws: ``([R, 2], [R, 2])``, lower ends clipped at 0.

    Previous rule: per side the wider of the percentile interval at ``alpha`` and the bootstrap-t read at
    ``a' = 0.25 alpha C' / (C' + 200)`` for every data set, from at least ``20 / a'`` replicates (the draws extended
    as :func:`harness.metrics.bootstrap.extended_weights` does). Kept so the simulations compare the two rules on the
    same data sets (``docs/statistics.md``)."""
    n = np.asarray(counts, dtype=np.float64)
    s = np.asarray(sums, dtype=np.float64)
    C, N = n.shape[0], float(n.sum())
    c_eff = effective_clusters(n)
    a_t = alpha * 0.25 * c_eff / (c_eff + 200.0)
    w = extended_weights(weights, int(math.ceil(20.0 / a_t - 1e-9))).astype(np.float64)
    r = s.sum(axis=0) / N
    e = s - n[:, None] * r[None, :]
    fac = C / (C - 1.0)
    se = np.sqrt(fac * (e**2).sum(axis=0)) / N
    Nb = w @ n
    d = (w @ e) / Nb[:, None]
    Q = w @ (e**2) - 2.0 * d * (w @ (e * n[:, None])) + d**2 * (w @ (n**2))[:, None]
    se_b = np.sqrt(fac * np.maximum(Q, 0.0)) / Nb[:, None]
    t = np.clip(np.divide(d, se_b, out=np.sign(d) * 1e12, where=se_b > 0), -1e12, 1e12)
    tq = np.quantile(t, [a_t, 1.0 - a_t], axis=0)
    dq = np.quantile(d, [alpha, 1.0 - alpha], axis=0)
    pct = np.stack([np.maximum(r + dq[0], 0.0), r + dq[1]], axis=1)
    prev = np.stack([np.maximum(np.minimum(r - tq[1] * se, pct[:, 0]), 0.0), np.maximum(r - tq[0] * se, pct[:, 1])], axis=1)
    return prev, pct
