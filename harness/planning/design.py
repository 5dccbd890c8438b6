"""Sample sizes under the source-cluster design (numpy + scipy; no torch).

The harness's mean KLD is a ratio estimator ``r = sum_c s_c / sum_c n_c`` over source clusters ``c``
(``s_c``: KLD summed over the cluster's positions, ``n_c``: its positions). With cluster residuals
``e_c = s_c - r n_c``, its standard error with ``C`` clusters of the pilot's average size ``nbar`` is
``se(C) = sqrt(sum e_c^2 / (C - 1)) / (nbar sqrt(C))``; a paired comparison uses the per-cluster
*differences* ``d_c = s_a,c - s_b,c``. Each arm of the predicted interval is ``t_(C-1)`` at the level
the harness reads that side at (:func:`harness.metrics.bootstrap.side_levels`), not at 2.5 %.

Reasoning: docs/diagnostics.md §"Sample sizes".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.metrics.bootstrap import ClusterShape, side_levels

LEVEL = 0.95
POWER = 0.80
MAX_CLUSTERS = 10**7


@dataclass(frozen=True)
class ClusterPilot:
    """Per-cluster sums of a pilot run: ``sums`` (KLD, or KLD differences), ``positions``, ``contexts``;
    ``difference``: the sums are paired differences (read as a statistic whose heavy side is not known in
    advance), else a KLD mean (right-skewed: :func:`harness.metrics.bootstrap.side_levels`)."""

    sums: np.ndarray
    positions: np.ndarray
    contexts: np.ndarray
    difference: bool = False

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
                   np.bincount(cid, minlength=C).astype(np.float64), other is not None)

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


def pilot_shape(p: ClusterPilot, clusters: int | None = None, *, independent_pair: bool = False) -> ClusterShape:
    """The :class:`~harness.metrics.bootstrap.ClusterShape` of ``clusters`` clusters like the pilot's (default: the
    pilot's own): skewness shrinks as ``1 / sqrt(C)``, the kurtosis term and the largest cluster's share as ``1 / C``,
    the effective cluster count grows as ``C``, the relative spread stays. ``independent_pair``: the difference of two
    independent candidates of this spread (symmetric: no skew, half the excess kurtosis)."""
    shape = ClusterShape.of(p.sums[:, None], p.positions)
    f = (clusters or p.n_clusters) / p.n_clusters
    skew = np.zeros(1) if independent_pair else shape.skew / math.sqrt(f)
    kurt = shape.kurt / f / (2.0 if independent_pair else 1.0)
    return ClusterShape(skew, kurt, shape.spread, np.minimum(shape.top_share / f, 1.0), shape.c_eff * f,
                        int(clusters or p.n_clusters))


def side_quantiles(p: ClusterPilot, clusters: int, level: float = LEVEL, *, independent_pair: bool = False) -> tuple[float, float]:
    """The arms ``(lower, upper)``, in standard errors, of the harness's ``level`` interval with ``clusters`` clusters
    like the pilot's: the interval is about ``[r - lower se, r + upper se]``. Each arm is the ``t_(C-1)`` quantile
    ``t`` at the level its side is read at (:func:`harness.metrics.bootstrap.side_levels` of :func:`pilot_shape`);
    for a mean (not a difference, whose skewness already lowers its levels) moved by the studentized mean's skewness
    term ``g (2 t^2 + 1) / 6`` (Hall's one-term Edgeworth expansion; ``g`` the skewness of the cluster residuals'
    total): a right-skewed total has the longer upper arm."""
    alpha = (1.0 - level) / 2.0
    shape = pilot_shape(p, clusters, independent_pair=independent_pair)
    rs = np.array([not (p.difference or independent_pair)])
    g = 0.0 if (p.difference or independent_pair) else float(shape.skew[0])
    t_lo, t_hi = (_t(1.0 - float(side_levels(alpha, shape, toward, rs)[0]), clusters) for toward in (-1, 1))
    return max(t_lo - g * (2.0 * t_lo**2 + 1.0) / 6.0, 0.0), max(t_hi + g * (2.0 * t_hi**2 + 1.0) / 6.0, 0.0)


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
    """Fewest clusters whose ``level`` interval has both arms within ``eps`` x the mean (:func:`achievable_eps`;
    None: more than :data:`MAX_CLUSTERS`)."""
    return _smallest(lambda c: achievable_eps(p, c, level) <= eps)


def clusters_for_difference(p: ClusterPilot, delta: float, level: float = LEVEL, power: float = POWER) -> int | None:
    """Fewest clusters at which the harness's ``level`` interval of the difference excludes 0 with ``power`` for a
    true difference ``delta`` (:func:`resolvable_delta`; paired pilot; None: more than :data:`MAX_CLUSTERS`)."""
    return _smallest(lambda c: resolvable_delta(p, c, level, power) <= abs(delta))


def _toward_zero(p: ClusterPilot, clusters: int, level: float, independent_pair: bool = False) -> tuple[float, float]:
    """The arms ``(near, far)`` of :func:`side_quantiles`: ``near`` the one that must clear 0 for a difference of the
    pilot's sign (the lower arm when the pilot's mean is >= 0, else the upper), ``far`` the other."""
    lower, upper = side_quantiles(p, clusters, level, independent_pair=independent_pair)
    return (lower, upper) if p.mean >= 0 else (upper, lower)


def power_at(p: ClusterPilot, delta: float, clusters: int, level: float = LEVEL) -> float:
    """Power of the harness's paired verdict ("A/B better": the ``level`` interval of the difference excludes 0 on
    the side of ``delta``) for a true difference ``delta`` of the pilot's sign with ``clusters``, under a shifted
    ``t_(C-1)``: each side read at its level, with its skewness term (:func:`side_quantiles`)."""
    df = max(clusters - 1, 1)
    near, far = _toward_zero(p, clusters, level)
    shift = abs(delta) / p.se(clusters)
    from scipy import special

    # t.sf(x, df) = stdtr(df, -x) and t.cdf(x, df) = stdtr(df, x), as scipy.stats computes them
    return float(special.stdtr(df, -(near - shift)) + special.stdtr(df, -far - shift))


def resolvable_delta(p: ClusterPilot, clusters: int | None = None, level: float = LEVEL, power: float = POWER,
                     *, independent_pair: bool = False) -> float:
    """The difference (of the pilot's sign) the harness's ``level`` interval separates from 0 with ``power`` with
    ``clusters`` (default: the pilot's own): ``(arm + t_(C-1)(power)) se``, ``arm`` the one that must clear 0
    (:func:`side_quantiles`)."""
    c = clusters or p.n_clusters
    return float((_toward_zero(p, c, level, independent_pair)[0] + _t(power, c)) * p.se(c))


def achievable_eps(p: ClusterPilot, clusters: int | None = None, level: float = LEVEL) -> float:
    """Relative half-width of the ``level`` interval of the mean with ``clusters`` (default: the pilot's): its
    longer arm (:func:`side_quantiles`) over the mean."""
    c = clusters or p.n_clusters
    return float(max(side_quantiles(p, c, level)) * p.se(c) / abs(p.mean)) if p.mean else math.inf


def single_run_resolvable_delta(rows: Sequence[Mapping[str, Any]], level: float = LEVEL, power: float = POWER) -> float | None:
    """Resolvable delta of one run alone: two *independent* candidates with this run's cluster spread
    (``sqrt(2) x`` its standard error, the levels of their symmetric difference). A paired comparison on the same
    positions resolves less."""
    p = ClusterPilot.from_rows(rows)
    if p.n_clusters < 3:
        return None
    return math.sqrt(2.0) * resolvable_delta(p, level=level, power=power, independent_pair=True)
