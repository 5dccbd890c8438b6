"""Source-cluster bootstrap (docs/design.md, section 2).

The unit of statistical independence is the *source cluster* (the document or conversation a
context was cut from). A replicate resamples the C clusters with replacement and keeps every
position of every context in them; cluster ``c`` drawn ``W[b, c]`` times contributes its positions
``W[b, c]`` times. A replicate draws C cluster ids uniformly with replacement (``rng.integers``) and counts them, so
all replicates come at once as an integer matrix ``W [B, C]`` (each row a Multinomial(C, 1/C) draw)
from ``numpy.random.default_rng(seed)``.

Reasoning: docs/statistics.md §"The bootstrap as implemented".
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.metrics.records import SideLevels
from harness.metrics.tails import weighted_tail_stats

DEFAULT_SEED = 20240601
DEFAULT_N_BOOT = 10_000
DEFAULT_N_BOOT_TAILS = 2_000
LEVEL = 0.95
#: Fewest source clusters for which any interval is reported; below it intervals are "not estimable".
MIN_CLUSTERS = 8
#: The interval method of means, recorded in every report's ``bootstrap.method``.
MEAN_METHOD = "studentized"
MEAN_METHOD_TEXT = (
    "source-cluster bootstrap-t (studentized: cluster-robust standard error per replicate), each side of a KLD-like mean "
    "read at a level set by the mean's relative standard error, the effective cluster count and the clusters' skewness "
    "and kurtosis (docs/statistics.md, 'Each side at its level'), each end of an agreement rate by the clusters' skewness "
    "toward and away from it ('Differences and agreement rates at their level')"
)
#: The interval method of differences and agreement rates (statistics whose heavy side is not known in advance).
DIFF_METHOD_TEXT = (
    "source-cluster bootstrap-t (studentized: cluster-robust standard error per replicate), each end read at a level "
    "set by the effective cluster count and the clusters' skewness toward and away from it and their kurtosis "
    "(docs/statistics.md, 'Differences and agreement rates at their level')"
)
#: Fewest source clusters for which the tails' (p99, CVaR1%) intervals are reported: below it the simulated
#: coverage falls short of 93 % (one side above 3.5 %) for skewed data at every level tried; at 250 clusters with
#: skewed cluster sizes it holds read at :data:`TAIL_ALPHA` (``docs/statistics.md``), so below 250 they are
#: "not estimable".
TAIL_MIN_CLUSTERS = 250
#: Each side's tail probability of the tails' percentile interval (a stated-95 % interval read at 0.25 % per
#: side: at 1 % per side the CVaR1% upper end missed 5.0-6.0 % of the time at 250 clusters with skewed sizes,
#: at 0.25 % 2.6-3.2 %).
TAIL_ALPHA = 0.0025
TAIL_METHOD_TEXT = (
    f"source-cluster bootstrap, percentile interval read at {TAIL_ALPHA:g} per side; not estimable below "
    f"{TAIL_MIN_CLUSTERS} source clusters"
)
#: The upper end of a right-skewed mean (:func:`side_levels`) is read at
#: ``UPPER_SCALE alpha / ((1 + (se / (REL_SE_SCALE r))^4) (1 + FEW_CLUSTERS / C') (1 + skew+ + UPPER_KURTOSIS_WEIGHT
#: kurt)^2)``:
#: its relative standard error ``se / r`` (the resampled ``t`` is too short-tailed when the clusters at hand lack the
#: population's rare heavy ones, and what such a cluster moves is the mean's relative error), a few-cluster term and
#: the residuals' skewness and excess kurtosis over C (heavy-tailed cluster effects). ``docs/statistics.md`` has the
#: simulations that chose the constants (fitted on the calibration and in-use shapes, two seeds each; reported
#: separately on shapes they were not fitted on; the scale 0.9 and the kurtosis weight 16 then moved a homogeneous
#: suite's upper miss from 2.2-2.85 % at 150-842 clusters toward the middle of [1 %, 2.5 %]: 'Both ends in the middle
#: of the band').
UPPER_SCALE = 0.9
REL_SE_SCALE = 0.1
REL_SE_POWER = 4.0
FEW_CLUSTERS = 10.0
UPPER_SKEW_WEIGHT = 1.0
UPPER_KURTOSIS_WEIGHT = 16.0
#: A statistic whose heavy side is not known in advance (a paired difference, an agreement rate) reads the end its
#: residuals skew toward at ``DIFF_SCALE alpha / ((1 + DIFF_FEW_CLUSTERS / C') (1 + DIFF_SKEW_WEIGHT (1 + DIFF_SKEW_FEW /
#: C') skew+ + DIFF_KURTOSIS_WEIGHT kurt)^2)`` and the other end at ``DIFF_SCALE alpha min(LOWER_CAP, 1 + DIFF_LIGHT_SLOPE
#: skew-)`` over the same first factor (``skew+`` / ``skew-`` the residuals' skew toward / away from that end, ``kurt`` their excess
#: kurtosis over C): the bootstrap-t of a skewed difference is too short on its heavy side and too long on its light
#: one, more so with few clusters. ``benchmarks/coverage_differences.py`` has the simulations that chose the constants
#: (fitted on paired differences of the calibration models and agreement rates; reported on shapes held out).
DIFF_SCALE = 0.8
DIFF_FEW_CLUSTERS = 8.0
DIFF_SKEW_WEIGHT = 3.0
DIFF_SKEW_FEW = 60.0
DIFF_KURTOSIS_WEIGHT = 10.0
DIFF_LIGHT_SLOPE = 5.0
#: The adaptive looks' replicate count drawn up front (:func:`harness.gate.adaptive.n_boot_for`) plans for a level
#: ``alpha_k C' / (C' + SMALL_SAMPLE_CLUSTERS)``; it never sets the level a side is read at (:func:`side_levels`), and
#: more are drawn inside :func:`ratio_intervals` where a side is read lower.
SMALL_SAMPLE_CLUSTERS = 200.0
#: No side is read below ``LEVEL_FLOOR * alpha`` (nor, for memory, where more than :data:`MAX_READ_ELEMENTS`
#: replicate x cluster entries would be needed).
LEVEL_FLOOR = 0.01
MAX_READ_ELEMENTS = 10_000_000
#: The dominance diagnostic (:func:`dominated`): one cluster holding more than this share of a statistic's total.
DOMINANT_SHARE = 0.5
#: The lower end of a right-skewed mean is read at ``LOWER_SCALE alpha min(LOWER_CAP, 1 + LOWER_SLOPE (se / r -
#: LOWER_REL)+)`` (``se / r`` its relative standard error): read at the stated ``alpha`` it missed 2.7-3.2 % from 150
#: clusters on (the bootstrap-t's lower end of a right-skewed mean sits a little high), so it is read lower; with few,
#: spread-out clusters it sits near 0 and misses far less than ``alpha``, so it is read higher there;
#: ``docs/statistics.md`` ('Both ends in the middle of the band') has the simulations.
LOWER_SCALE = 0.7
LOWER_REL = 0.15
LOWER_SLOPE = 8.0
LOWER_CAP = 2.4
#: Fewest replicates beyond each bootstrap-t bound: :func:`ratio_intervals` reads its quantiles from at least
#: ``MIN_BEYOND / a'`` replicates (:func:`replicates_needed`), extending a smaller draw (:func:`extended_weights`).
MIN_BEYOND = 20
_BLOCK_ELEMENTS = 1 << 22  # replicates x statistics per block of ratio_intervals (bounds memory)


@dataclass(frozen=True)
class ClusterShape:
    """What :func:`side_levels` reads of one data set's cluster residuals ``e_c = s_c - r n_c`` (one entry per
    statistic): ``skew`` ``sum e^3 / (sum e^2)^1.5`` (the standardized third cumulant of the total, signed),
    ``kurt`` ``max(C sum e^4 / (sum e^2)^2 - 3, 0) / C`` (excess kurtosis over C), ``spread`` ``se sqrt(C') / |r|``
    (the clusters' relative spread; inf when ``r`` is 0), ``top_share`` ``max_c |s_c| / sum_c |s_c|`` (the largest
    cluster's share of the statistic's total: :func:`dominated`), ``c_eff`` (:func:`effective_clusters`) and the
    cluster count ``n_clusters``."""

    skew: np.ndarray
    kurt: np.ndarray
    spread: np.ndarray
    top_share: np.ndarray
    c_eff: float
    n_clusters: int

    @classmethod
    def of(cls, sums: np.ndarray, counts: np.ndarray) -> ClusterShape:
        """The shape of per-cluster ``sums`` ``[C, k]`` over positions ``counts`` ``[C]``."""
        n = np.asarray(counts, dtype=np.float64)
        s = np.asarray(sums, dtype=np.float64)
        C, N = n.shape[0], float(n.sum())
        r = s.sum(axis=0) / N
        e = s - n[:, None] * r[None, :]
        e2 = e * e
        s2 = e2.sum(axis=0)
        s3 = (e2 * e).sum(axis=0)
        s4 = (e2 * e2).sum(axis=0)
        c_eff = effective_clusters(n)
        pos = s2 > 0
        safe = np.where(pos, s2, 1.0)
        skew = np.where(pos, s3 / safe**1.5, 0.0)
        kurt = np.where(pos, np.maximum(C * s4 / safe**2 - 3.0, 0.0) / C, 0.0)
        se = np.sqrt(C / (C - 1.0) * s2) / N
        with np.errstate(divide="ignore", invalid="ignore"):
            spread = np.where(r != 0, se * math.sqrt(c_eff) / np.abs(r), math.inf)
        total = np.abs(s).sum(axis=0)
        top_share = np.abs(s).max(axis=0) / np.where(total > 0, total, 1.0)
        return cls(skew, kurt, spread, top_share, c_eff, C)


def side_levels(alpha: float, shape: ClusterShape, toward: int, right_skewed: np.ndarray) -> np.ndarray:
    """Per statistic, the tail probability at which the bootstrap-t quantile of one side is read for a stated
    one-sided ``alpha`` (0: the side is not read; returns zeros). ``toward`` +1 is the upper end, -1 the lower.

    A ``right_skewed`` statistic (a mean of nonnegative, right-tailed per-position values: KLD, JSD) reads its lower
    end at ``LOWER_SCALE alpha min(LOWER_CAP, 1 + LOWER_SLOPE (se / r - LOWER_REL)+)`` (``se / r = spread / sqrt(C')``) and its
    upper end at ``UPPER_SCALE alpha / ((1 + (se / (REL_SE_SCALE r))^4) (1 + FEW_CLUSTERS / C') (1 + skew+ + UPPER_KURTOSIS_WEIGHT
    kurt)^2)`` (the module constants; ``skew+`` the positive part of the residuals' skew). Any other statistic (a
    paired difference, an agreement rate: the heavy side is not known in advance) reads each end at ``DIFF_SCALE alpha
    min(LOWER_CAP, 1 + DIFF_LIGHT_SLOPE skew-) / ((1 + DIFF_FEW_CLUSTERS / C') (1 + DIFF_SKEW_WEIGHT (1 + DIFF_SKEW_FEW / C') skew+ +
    DIFF_KURTOSIS_WEIGHT kurt)^2)`` (``skew+`` / ``skew-`` the residuals' skew toward / away from that end). A side the
    dominance diagnostic widens (:func:`dominated`: the upper end of a right-skewed mean, both ends of any other) is
    read at the floor. Never below ``LEVEL_FLOOR * alpha`` (and the memory floor ``MIN_BEYOND C / MAX_READ_ELEMENTS``)."""
    k = shape.skew.shape[0]
    if alpha <= 0:
        return np.zeros(k)
    rs = np.broadcast_to(np.asarray(right_skewed, dtype=bool), (k,))
    c = shape.c_eff
    skew = np.maximum(toward * shape.skew, 0.0)
    light = np.minimum(LOWER_CAP, 1.0 + DIFF_LIGHT_SLOPE * np.maximum(-toward * shape.skew, 0.0))
    level = DIFF_SCALE * alpha * light / ((1.0 + DIFF_FEW_CLUSTERS / c)
                             * (1.0 + DIFF_SKEW_WEIGHT * (1.0 + DIFF_SKEW_FEW / c) * skew + DIFF_KURTOSIS_WEIGHT * shape.kurt) ** 2)
    floor = level_floor(alpha, shape.n_clusters)
    rel = shape.spread / math.sqrt(c)
    if toward < 0:
        own = LOWER_SCALE * alpha * np.minimum(LOWER_CAP, 1.0 + LOWER_SLOPE * np.maximum(rel - LOWER_REL, 0.0))
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            own = UPPER_SCALE * alpha / ((1.0 + (rel / REL_SE_SCALE) ** REL_SE_POWER) * (1.0 + FEW_CLUSTERS / c)
                           * (1.0 + UPPER_SKEW_WEIGHT * skew + UPPER_KURTOSIS_WEIGHT * shape.kurt) ** 2)
        own = np.where(np.isfinite(rel), own, 0.0)
    level = np.where(rs, own, level)
    widened = dominated(shape) & (~rs if toward < 0 else np.ones(k, dtype=bool))
    level = np.where(widened, floor, level)
    return np.asarray(np.maximum(level, floor), dtype=np.float64)


def dominated(shape: ClusterShape) -> np.ndarray:
    """Per statistic, whether the dominance diagnostic fires: one cluster holds more than :data:`DOMINANT_SHARE` of
    the statistic's total (``top_share``). The mean then rests on that one cluster: the interval's level is not
    guaranteed at this cluster count (``docs/statistics.md``, 'When the level is not guaranteed')."""
    return np.asarray(shape.top_share > DOMINANT_SHARE, dtype=bool)


@dataclass(frozen=True)
class SideReading:
    """How one statistic's interval was read (recorded in every report's ``bootstrap.levels``): the tail probability
    each end was read at (``lower``, ``upper``; 0: that end not read, infinite), whether that end sat at the floor
    (:func:`level_floor`: the level rule's terms saturate there or the dominance diagnostic widened it), whether the
    dominance diagnostic fired (``dominated``: level not guaranteed) and the largest cluster's share of the total
    (``top_share``)."""

    lower: float
    upper: float
    lower_at_floor: bool
    upper_at_floor: bool
    dominated: bool
    top_share: float

    def to_json(self) -> SideLevels:
        return {"lower": self.lower, "upper": self.upper, "lower_at_floor": self.lower_at_floor,
                "upper_at_floor": self.upper_at_floor, "dominated": self.dominated, "top_share": self.top_share}


def method_text(readings: Sequence[SideReading | None], name: str = "the mean") -> str:
    """:data:`MEAN_METHOD_TEXT`, followed where the dominance diagnostic fired on ``readings`` (the headline's) by
    the warning that the level is not guaranteed and how the interval was widened."""
    fired = [r for r in readings if r is not None and r.dominated]
    if not fired:
        return MEAN_METHOD_TEXT
    share = max(r.top_share for r in fired)
    return (f"{MEAN_METHOD_TEXT}; LEVEL NOT GUARANTEED at this cluster count: one source cluster holds {100 * share:.0f} % "
            f"of {name}'s total (more than {100 * DOMINANT_SHARE:.0f} %), so its upper end was read at the floor "
            f"{LEVEL_FLOOR:g} x the stated level")


def level_floor(alpha: float, n_clusters: float) -> float:
    """The smallest level any side is read at: ``LEVEL_FLOOR * alpha``, or where reading it would need more than
    :data:`MAX_READ_ELEMENTS` replicate x cluster entries, the level ``MIN_BEYOND`` replicates of that many make
    (never above ``alpha``)."""
    return min(alpha, max(alpha * LEVEL_FLOOR, MIN_BEYOND * max(n_clusters, 1.0) / MAX_READ_ELEMENTS))


def replicates_needed(levels: np.ndarray) -> int:
    """Replicates from which :func:`ratio_intervals` reads bootstrap-t quantiles at ``levels`` (the positive ones) so
    that at least :data:`MIN_BEYOND` lie beyond each (0 when none is read)."""
    pos = np.asarray(levels, dtype=np.float64)
    pos = pos[pos > 0]
    return int(math.ceil(MIN_BEYOND / float(pos.min()) - 1e-9)) if pos.size else 0


def read_rows(n_boot: int, needed: int) -> int:
    """Replicates one statistic's quantiles are read from: the ``n_boot`` drawn when they hold ``needed``, else
    ``n_boot`` doubled until they do (the draws' own extension, :func:`extended_weights`). A statistic's interval
    so depends on its own sums and the draws only, never on the other statistics of the same call."""
    rows = max(int(n_boot), 1)
    while rows < needed:
        rows *= 2
    return rows


def extended_weights(weights: np.ndarray, n_rows: int) -> np.ndarray:
    """``weights`` followed by further replicates up to ``n_rows`` rows (itself when it has as many).

    The further rows are cluster multiplicities like :func:`draw_cluster_weights`, from a generator seeded by the
    sha256 of ``weights``: the same draws always get the same extension, so an interval recomputed from a report's
    ``n_boot`` and ``seed`` is the same, and the two candidates of a paired comparison share it."""
    B, C = weights.shape
    if B >= n_rows:
        return weights
    seed = int.from_bytes(hashlib.sha256(np.ascontiguousarray(weights).tobytes()).digest()[:8], "little")
    extra = draw_cluster_weights(C, n_rows - B, seed).astype(weights.dtype)
    return np.concatenate([weights, extra], axis=0)


def effective_clusters(counts: np.ndarray) -> float:
    """Kish's effective number of clusters ``(sum n_c)^2 / sum n_c^2`` of clusters with ``n_c`` positions: C when
    all are equal, fewer when a few clusters hold most positions (the ratio mean then rests on those few)."""
    n = np.asarray(counts, dtype=np.float64)
    return float(n.sum() ** 2 / (n**2).sum())


_BLOCK = 128  # replicates per block in the tail bootstrap (bounds memory: BLOCK x tail size)


def draw_cluster_weights(n_clusters: int, n_boot: int, seed: int) -> np.ndarray:
    """Multiplicities ``[n_boot, n_clusters]`` (int32) of a cluster bootstrap with replacement."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_clusters, size=(n_boot, n_clusters), dtype=np.int64)
    idx += (np.arange(n_boot, dtype=np.int64) * n_clusters)[:, None]
    counts = np.bincount(idx.ravel(), minlength=n_boot * n_clusters)
    return counts.reshape(n_boot, n_clusters).astype(np.int32)


def percentile_interval(replicates: np.ndarray, level: float = LEVEL) -> list[float]:
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(replicates, [a, 1.0 - a], method="linear")
    return [float(lo), float(hi)]


def ratio_intervals(
    weights: np.ndarray,
    sums: np.ndarray,
    counts: np.ndarray,
    *,
    alpha_lo: float = (1.0 - LEVEL) / 2.0,
    alpha_hi: float = (1.0 - LEVEL) / 2.0,
    bounds: tuple[float, float] = (-math.inf, math.inf),
    right_skewed: bool | Sequence[bool] | None = None,
) -> list[list[float] | None]:
    """The intervals of :func:`ratio_intervals_read` (same arguments), without the record of how they were read."""
    return ratio_intervals_read(weights, sums, counts, alpha_lo=alpha_lo, alpha_hi=alpha_hi, bounds=bounds,
                                right_skewed=right_skewed)[0]


def ratio_intervals_read(
    weights: np.ndarray,
    sums: np.ndarray,
    counts: np.ndarray,
    *,
    alpha_lo: float = (1.0 - LEVEL) / 2.0,
    alpha_hi: float = (1.0 - LEVEL) / 2.0,
    bounds: tuple[float, float] = (-math.inf, math.inf),
    right_skewed: bool | Sequence[bool] | None = None,
) -> tuple[list[list[float] | None], list[SideReading | None]]:
    """Studentized cluster-bootstrap intervals of ratio means ``sum(sums) / sum(counts)``.

    ``weights`` are cluster multiplicities ``[B, C]`` (:func:`draw_cluster_weights`), ``sums`` per
    cluster ``[C]`` or ``[C, k]`` (k statistics share one draw), ``counts`` per cluster ``[C]``
    (positions, all > 0). The lower end misses the true mean with probability ``alpha_lo`` and the
    upper end with ``alpha_hi`` (0.025 each: a two-sided 95 % interval; one side 0: a one-sided bound).
    ``right_skewed`` (one flag, or one per statistic; default: whether ``bounds`` is ``[0, inf)``, a KLD-like
    mean) selects the level rule of :func:`side_levels`.

    Per statistic, with ``r = S / N`` and cluster residuals ``e_c = s_c - r n_c``:

    * cluster-robust (CR1) standard error ``se = sqrt(C / (C - 1) * sum e_c^2) / N``;
    * replicate ``b``: ``r_b = r + (W_b . e) / N_b`` and its own ``se_b`` from the residuals about
      ``r_b`` (``sum_c W_bc (e_c - (r_b - r) n_c)^2``, expanded into three matrix products);
    * bootstrap-t: ``[r - t_(1 - a'_lo) se, r - t_(a'_hi) se]`` with ``t_b = (r_b - r) / se_b``, each side's
      quantile read at its level ``a'`` (:func:`side_levels`: from the stated ``alpha``, the effective cluster
      count and the residuals' :class:`ClusterShape`), clipped to ``bounds`` (the statistic's possible range).

    Each statistic's quantiles come from at least ``MIN_BEYOND / a'`` replicates (:func:`replicates_needed` of its
    smaller level, :func:`read_rows`): ``weights`` extended by :func:`extended_weights` when it holds fewer, so at
    least :data:`MIN_BEYOND` replicates lie beyond each bound.

    Returns one ``[lo, hi]`` per statistic and one :class:`SideReading` (each side's level, floor and the dominance
    diagnostic), or ``None`` for every statistic in both when there are fewer than :data:`MIN_CLUSTERS` clusters
    (not estimable).
    """
    n = np.asarray(counts, dtype=np.float64)
    s = np.asarray(sums, dtype=np.float64)
    s2 = s[:, None] if s.ndim == 1 else s
    C = n.shape[0]
    k = s2.shape[1]
    if C < MIN_CLUSTERS:
        return [None] * k, [None] * k
    if right_skewed is None:
        right_skewed = bounds[0] == 0.0 and bounds[1] == math.inf
    rs = np.broadcast_to(np.asarray(right_skewed, dtype=bool), (k,))
    shape = ClusterShape.of(s2, n)
    a_lo, a_hi = side_levels(alpha_lo, shape, -1, rs), side_levels(alpha_hi, shape, +1, rs)
    B = weights.shape[0]
    rows_lo = np.array([read_rows(B, replicates_needed(a_lo[j : j + 1])) for j in range(k)])
    rows_hi = np.array([read_rows(B, replicates_needed(a_hi[j : j + 1])) for j in range(k)])
    rows = np.maximum(rows_lo, rows_hi)
    w = extended_weights(weights, int(rows.max()))
    w = w if w.dtype == np.float64 else w.astype(np.float64)
    lo = np.empty(k)
    hi = np.empty(k)
    for n_rows in np.unique(rows):
        idx = np.flatnonzero(rows == n_rows)
        wr = w[: int(n_rows)]
        block = max(1, _BLOCK_ELEMENTS // wr.shape[0])
        for j in range(0, idx.shape[0], block):
            sl = idx[j : j + block]
            lo[sl], hi[sl] = _studentized_block(wr, n, s2[:, sl], (a_lo[sl], rows_lo[sl]), (a_hi[sl], rows_hi[sl]))
    lo = np.clip(lo, bounds[0], bounds[1])
    hi = np.clip(hi, bounds[0], bounds[1])
    fl_lo, fl_hi = (level_floor(a, C) * (1.0 + 1e-12) for a in (alpha_lo, alpha_hi))
    dom = dominated(shape)
    reads: list[SideReading | None] = [
        SideReading(float(a_lo[j]), float(a_hi[j]), bool(0 < a_lo[j] <= fl_lo), bool(0 < a_hi[j] <= fl_hi), bool(dom[j]),
                    float(shape.top_share[j]))
        for j in range(k)
    ]
    return [[float(lo[j]), float(hi[j])] for j in range(k)], reads


def _studentized_block(
    w: np.ndarray, n: np.ndarray, s2: np.ndarray, side_lo: tuple[np.ndarray, np.ndarray], side_hi: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Unclipped lower and upper ends of :func:`ratio_intervals` for the statistics ``s2`` [C, k]; ``side_lo`` and
    ``side_hi`` are each side's levels [k] (0 where that side is not read: an infinite end) and the replicates
    (first rows of ``w``) it is read from [k]. Replicates run along the rows' last axis ([k, B])."""
    a_lo, a_hi = side_lo[0], side_hi[0]
    C, k = s2.shape
    N = float(n.sum())
    r = s2.sum(axis=0) / N
    e = s2 - n[:, None] * r[None, :]
    factor = C / (C - 1.0)
    se = np.sqrt(factor * (e**2).sum(axis=0)) / N
    wt = w.T
    Nb = n @ wt
    d = (e.T @ wt) / Nb[None, :]  # r_b - r, [k, B]
    # se_b = sqrt(factor * max(Q, 0)) / N_b, Q = W.e^2 - 2 d W.(e n) + d^2 W.n^2 (in place: the arrays are [k, B])
    se_b = (e**2).T @ wt
    tmp = (e * n[:, None]).T @ wt
    tmp *= d
    tmp *= 2.0
    se_b -= tmp
    np.multiply(d, d, out=tmp)
    tmp *= ((n**2) @ wt)[None, :]
    se_b += tmp
    np.maximum(se_b, 0.0, out=se_b)
    se_b *= factor
    np.sqrt(se_b, out=se_b)
    se_b /= Nb[None, :]
    positive = se_b > 0
    t = np.sign(d)
    t *= 1e12  # t where se_b = 0 (every drawn cluster at the replicate's mean)
    np.divide(d, se_b, out=t, where=positive)
    np.clip(t, -1e12, 1e12, out=t)
    del tmp, positive, d, se_b
    with np.errstate(invalid="ignore"):
        t_hi = _prefix_quantiles(t, side_lo[1], 1.0 - a_lo)
        t_lo = _prefix_quantiles(t, side_hi[1], a_hi)
        lo = np.where(a_lo > 0, np.where(se > 0, r - t_hi * se, r), -np.inf)
        hi = np.where(a_hi > 0, np.where(se > 0, r - t_lo * se, r), np.inf)
    return lo, hi


def _prefix_quantiles(t: np.ndarray, rows: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Row ``j`` of ``t`` [k, B]: the quantile at ``q[j]`` of its first ``rows[j]`` replicates."""
    out = np.empty(t.shape[0])
    for m in np.unique(rows):
        idx = np.flatnonzero(rows == m)
        out[idx] = _sorted_row_quantiles(np.sort(t[idx, : int(m)], axis=1), q[idx])
    return out


def _sorted_row_quantiles(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """numpy's "linear" quantile of every row of the row-sorted ``x`` [k, B], row ``j`` at ``q[j]``."""
    B = x.shape[1]
    v = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0) * (B - 1)
    lo = np.clip(np.floor(v).astype(np.int64), 0, B - 1)
    hi = np.minimum(lo + 1, B - 1)
    f = v - lo
    rows = np.arange(x.shape[0])
    a, b = x[rows, lo], x[rows, hi]
    return np.asarray(np.where(f < 0.5, a + (b - a) * f, b - (b - a) * (1.0 - f)), dtype=np.float64)


def ratio_interval(
    weights: np.ndarray, sums: np.ndarray, counts: np.ndarray, level: float = LEVEL,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> list[float] | None:
    """The two-sided studentized interval at ``level`` of one ratio mean (see :func:`ratio_intervals`)."""
    a = (1.0 - level) / 2.0
    return ratio_intervals(weights, sums, counts, alpha_lo=a, alpha_hi=a, bounds=bounds)[0]


def ratio_replicates(weights: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``(W @ sums) / (W @ counts)`` per replicate (counts > 0 in every replicate: C >= 1 drawn).

    ``sums`` may be ``[C]`` or ``[C, k]`` (k statistics at once, one matrix product)."""
    w = weights if weights.dtype == np.float64 else weights.astype(np.float64)
    s = np.asarray(sums, dtype=np.float64)
    den = w @ np.asarray(counts, dtype=np.float64)
    num = w @ s
    return num / (den[:, None] if num.ndim == 2 else den)


@dataclass
class TailData:
    """Positions sorted descending, with cluster ids, for the tail bootstrap."""

    desc_values: np.ndarray
    desc_cluster: np.ndarray
    cluster_counts: np.ndarray

    @classmethod
    def build(cls, values: np.ndarray, cluster_of_position: np.ndarray, n_clusters: int) -> TailData:
        order = np.argsort(-values, kind="stable")
        return cls(
            values[order].astype(np.float64),
            cluster_of_position[order],
            np.bincount(cluster_of_position, minlength=n_clusters).astype(np.float64),
        )


def tail_replicates(
    data: TailData, weights: np.ndarray, q: float = 0.99, alpha: float = 0.01
) -> tuple[np.ndarray, np.ndarray]:
    """Replicates of the "linear" quantile ``q`` and CVaR(``alpha``) under cluster multiplicities ``weights``."""
    n = data.desc_values.shape[0]
    totals_all = weights.astype(np.float64) @ data.cluster_counts
    quants = np.empty(weights.shape[0])
    cvars = np.empty(weights.shape[0])
    depth = min(n, max(256, int(1.5 * (1.0 - min(q, 1.0 - alpha)) * n) + 256))
    for b0 in range(0, weights.shape[0], _BLOCK):
        wb = weights[b0 : b0 + _BLOCK]
        tot = totals_all[b0 : b0 + _BLOCK]
        m = depth
        while True:
            qv, cv, ok = weighted_tail_stats(data.desc_values[:m], wb[:, data.desc_cluster[:m]], tot, q, alpha)
            if ok.all() or m >= n:
                break
            m = min(n, 2 * m)
        quants[b0 : b0 + _BLOCK] = qv
        cvars[b0 : b0 + _BLOCK] = cv
    return quants, cvars
