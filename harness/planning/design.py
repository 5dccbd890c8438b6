"""Sample sizes under the source-cluster design (numpy + scipy; no torch).

The harness's mean KLD is a ratio estimator ``r = sum_c s_c / sum_c n_c`` over source clusters ``c``
(``s_c``: KLD summed over the cluster's positions, ``n_c``: its positions). With cluster residuals
``e_c = s_c - r n_c`` and ``sigma^2 = sum e_c^2 / (C - 1)``, its standard error with ``C`` clusters
of the pilot's average size ``nbar`` is ``se(C) = sigma / (nbar sqrt(C))`` (the cluster-robust,
linearized variance). A paired comparison of two candidates on the same positions uses the same
formula on the per-cluster *differences* ``d_c = s_a,c - s_b,c``.

Reasoning: docs/diagnostics.md §"Sample sizes".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEVEL = 0.95
POWER = 0.80
MAX_CLUSTERS = 10**7


@dataclass(frozen=True)
class ClusterPilot:
    """Per-cluster sums of a pilot run: ``sums`` (KLD, or KLD differences), ``positions``, ``contexts``."""

    sums: np.ndarray
    positions: np.ndarray
    contexts: np.ndarray

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]] | None = None) -> ClusterPilot:
        """From per-context report rows (``cluster``, ``positions``, ``sum_kld``); with ``other``, the paired
        differences ``self - other`` (contexts matched by ``index``; both must hold the same contexts)."""
        sub: dict[int, float] = {}
        if other is not None:
            sub = {int(r["index"]): float(r["sum_kld"]) for r in other}
            idx = {int(r["index"]) for r in rows}
            if idx != set(sub):
                raise ValueError(f"paired pilot: the two candidates cover different contexts ({len(idx ^ set(sub))} differ)")
        names: dict[str, int] = {}
        cid = np.array([names.setdefault(str(r["cluster"]), len(names)) for r in rows], dtype=np.int64)
        s = np.array([float(r["sum_kld"]) - sub.get(int(r["index"]), 0.0) for r in rows])
        n = np.array([float(r["positions"]) for r in rows])
        C = len(names)
        return cls(np.bincount(cid, weights=s, minlength=C), np.bincount(cid, weights=n, minlength=C),
                   np.bincount(cid, minlength=C).astype(np.float64))

    @property
    def n_clusters(self) -> int:
        return int(self.sums.shape[0])

    @property
    def mean(self) -> float:
        return float(self.sums.sum() / self.positions.sum())

    @property
    def sigma(self) -> float:
        """Cluster residual standard deviation (positions-weighted ratio residuals)."""
        e = self.sums - self.mean * self.positions
        return float(math.sqrt((e**2).sum() / (self.n_clusters - 1)))

    @property
    def nbar(self) -> float:
        return float(self.positions.mean())

    @property
    def contexts_per_cluster(self) -> float:
        return float(self.contexts.mean())

    def se(self, clusters: int) -> float:
        return self.sigma / (self.nbar * math.sqrt(clusters))


def _t(q: float, clusters: int) -> float:
    # Student's t quantile through scipy.special (what scipy.stats.t.ppf calls), imported where needed:
    # scipy.stats costs a CPU second to import, scipy.special a third of that
    from scipy import special

    return float(special.stdtrit(max(clusters - 1, 1), q))


def _smallest(ok: Any) -> int | None:
    """The fewest clusters (>= 2) for which ``ok`` holds; None when not even :data:`MAX_CLUSTERS` suffice
    (the search stops there: the answer is "more than MAX_CLUSTERS", never the cap itself)."""
    lo, hi = 2, 2
    while not ok(hi):
        if hi >= MAX_CLUSTERS:
            return None
        lo, hi = hi + 1, min(hi * 2, MAX_CLUSTERS)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return lo


def clusters_for_precision(p: ClusterPilot, eps: float, level: float = LEVEL) -> int | None:
    """Fewest clusters whose ``level`` interval half-width is within ``eps`` x the mean (None: more than
    :data:`MAX_CLUSTERS`)."""
    q = 0.5 + level / 2
    return _smallest(lambda c: _t(q, c) * p.se(c) <= eps * abs(p.mean))


def clusters_for_difference(p: ClusterPilot, delta: float, level: float = LEVEL, power: float = POWER) -> int | None:
    """Fewest clusters for a two-sided test at ``level`` to detect ``delta`` with ``power`` (paired pilot; None:
    more than :data:`MAX_CLUSTERS`)."""
    q = 0.5 + level / 2
    return _smallest(lambda c: (_t(q, c) + _t(power, c)) * p.se(c) <= abs(delta))


def power_at(p: ClusterPilot, delta: float, clusters: int, level: float = LEVEL) -> float:
    """Power of the two-sided cluster t-test at ``level`` for a true difference ``delta`` with ``clusters``."""
    df = max(clusters - 1, 1)
    tc = _t(0.5 + level / 2, clusters)
    shift = abs(delta) / p.se(clusters)
    from scipy import special

    # t.sf(x, df) = stdtr(df, -x) and t.cdf(x, df) = stdtr(df, x), as scipy.stats computes them
    return float(special.stdtr(df, -(tc - shift)) + special.stdtr(df, -tc - shift))


def resolvable_delta(p: ClusterPilot, clusters: int | None = None, level: float = LEVEL, power: float = POWER) -> float:
    """The difference detected with ``power`` at ``level`` with ``clusters`` (default: the pilot's own)."""
    c = clusters or p.n_clusters
    return float((_t(0.5 + level / 2, c) + _t(power, c)) * p.se(c))


def achievable_eps(p: ClusterPilot, clusters: int | None = None, level: float = LEVEL) -> float:
    """Relative half-width of the ``level`` interval of the mean with ``clusters`` (default: the pilot's)."""
    c = clusters or p.n_clusters
    return float(_t(0.5 + level / 2, c) * p.se(c) / abs(p.mean)) if p.mean else math.inf


def single_run_resolvable_delta(rows: Sequence[Mapping[str, Any]], level: float = LEVEL, power: float = POWER) -> float | None:
    """Resolvable delta of one run alone: two *independent* candidates with this run's cluster spread
    (``sqrt(2) x`` its standard error). A paired comparison on the same positions resolves less."""
    p = ClusterPilot.from_rows(rows)
    if p.n_clusters < 3:
        return None
    return math.sqrt(2.0) * resolvable_delta(p, level=level, power=power)
