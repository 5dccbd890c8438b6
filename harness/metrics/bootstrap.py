"""Source-cluster bootstrap (docs/design.md, section 2).

The unit of statistical independence is the *source cluster* (the document or conversation a
context was cut from). A replicate resamples the C clusters with replacement and keeps every
position of every context in them; cluster ``c`` drawn ``W[b, c]`` times contributes its positions
``W[b, c]`` times. A replicate draws C cluster ids uniformly with replacement (``rng.integers``) and counts them, so
all replicates come at once as an integer matrix ``W [B, C]`` (each row a Multinomial(C, 1/C) draw)
from ``numpy.random.default_rng(seed)``.

* Means (KLD, top-1, EAR, JSD) are ratios of sums: ``(W @ cluster_sums) / (W @ cluster_counts)``:
  vectorized, O(B * C).
* Tail statistics (p99, CVaR1) use the same multiplicities as position weights on the pooled
  positions (never per-context quantiles); only the descending-sorted top of the data is
  needed, see :mod:`harness.metrics.tails`. They use ``n_boot_tails`` replicates (default 2,000,
  the first rows of the same draw matrix) because each costs O(tail size).
* Intervals of means (and of mean differences) are **studentized** (:func:`ratio_intervals`): per
  side the wider of the bootstrap-t interval (each replicate's ratio divided by its own
  cluster-robust standard error) and the percentile interval. The percentile interval alone covers
  too little with few, skewed clusters (about 88-92 % at 16 clusters, nominal 95 %) and misses on the
  upper side, the side that lets a candidate pass; ``docs/statistics.md`` has the coverage table
  that chose this rule. Below :data:`MIN_CLUSTERS` source clusters no interval is estimable and
  ``None`` is returned, never a zero-width interval.
* Tail statistics (p99, CVaR1) keep percentile intervals: no cluster-robust standard error of a
  quantile exists per replicate without a second bootstrap level. Their misses are almost all on the
  upper side and shrink slowly with clusters, so below :data:`TAIL_MIN_CLUSTERS` clusters they are
  not estimable (``None``).
* Paired comparisons apply the same ``W`` to both candidates (common random numbers).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

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
    "source-cluster bootstrap, studentized: per side the wider of the bootstrap-t interval "
    "(cluster-robust standard error per replicate) and the percentile interval"
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
#: Small-sample calibration of the bootstrap-t: each side's quantile is read at
#: ``alpha * CALIBRATION_FACTOR * C / (C + CALIBRATION_CLUSTERS)``. ``docs/statistics.md`` has the simulation
#: that chose it: with right-skewed cluster effects the upper end (the gating side: a too-low upper bound lets
#: a candidate pass ``max_ci_high``) misses more than its stated 2.5 % at every cluster count when read at
#: ``alpha`` (7-15 % on Pareto and lognormal-1.3 cluster effects); the ``C / (C + K)`` term corrects the
#: few-cluster excess, the factor the excess that remains at hundreds of clusters. It is 0.25 / 200: at 0.5 / 120
#: lognormal cluster effects of log-sd 1.3 with skewed cluster sizes missed 3.2-4.4 % at 16-85 clusters and
#: Pareto(2.2) cluster effects 3.3-4.1 % at 40-842 (``benchmarks/coverage_unseen.py``).
CALIBRATION_CLUSTERS = 200.0
CALIBRATION_FACTOR = 0.25


def calibrated_alpha(alpha: float, n_clusters: float) -> float:
    """The tail probability at which the bootstrap-t quantile is read for a stated one-sided ``alpha``;
    ``n_clusters`` is the effective number of clusters (:func:`effective_clusters`: the cluster count when
    every cluster holds as many positions).

    ``n_boot * calibrated_alpha(alpha, C)`` replicates lie beyond each bootstrap-t bound (2.4 at 8 clusters with
    the default 10,000 replicates, 4.6 at 16, 11.9 at 47, 18.6 at 85, 50.5 at 842)."""
    return alpha * CALIBRATION_FACTOR * n_clusters / (n_clusters + CALIBRATION_CLUSTERS)


#: Fewest replicates beyond each bootstrap-t bound: :func:`ratio_intervals` reads its quantiles from at least
#: ``MIN_BEYOND / a'`` replicates (:func:`replicates_needed`), extending a smaller draw (:func:`extended_weights`).
MIN_BEYOND = 20
_BLOCK_ELEMENTS = 1 << 22  # replicates x statistics per block of ratio_intervals (bounds memory)


def replicates_needed(n_clusters: float, alpha_lo: float, alpha_hi: float) -> int:
    """Replicates from which :func:`ratio_intervals` reads a bootstrap-t quantile at ``calibrated_alpha`` of the
    smaller positive side so that at least :data:`MIN_BEYOND` lie beyond it (0 when neither side is read)."""
    sides = [a for a in (alpha_lo, alpha_hi) if a > 0]
    return int(math.ceil(MIN_BEYOND / calibrated_alpha(min(sides), n_clusters) - 1e-9)) if sides else 0


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
) -> list[list[float] | None]:
    """Studentized cluster-bootstrap intervals of ratio means ``sum(sums) / sum(counts)``.

    ``weights`` are cluster multiplicities ``[B, C]`` (:func:`draw_cluster_weights`), ``sums`` per
    cluster ``[C]`` or ``[C, k]`` (k statistics share one draw), ``counts`` per cluster ``[C]``
    (positions, all > 0). The lower end misses the true mean with probability ``alpha_lo`` and the
    upper end with ``alpha_hi`` (0.025 each: a two-sided 95 % interval; one side 0: a one-sided bound).

    Per statistic, with ``r = S / N`` and cluster residuals ``e_c = s_c - r n_c``:

    * cluster-robust (CR1) standard error ``se = sqrt(C / (C - 1) * sum e_c^2) / N``;
    * replicate ``b``: ``r_b = r + (W_b . e) / N_b`` and its own ``se_b`` from the residuals about
      ``r_b`` (``sum_c W_bc (e_c - (r_b - r) n_c)^2``, expanded into three matrix products);
    * bootstrap-t: ``[r - t_(1 - a'_lo) se, r - t_(a'_hi) se]`` with ``t_b = (r_b - r) / se_b``, each quantile
      read at the calibrated level ``a' = calibrated_alpha(alpha, effective_clusters(counts))``;
    * percentile: ``[q_(alpha_lo)(r_b), q_(1 - alpha_hi)(r_b)]``;
    * per side the wider of the two, clipped to ``bounds`` (the statistic's possible range).

    The quantiles come from at least ``MIN_BEYOND / a'`` replicates (:func:`replicates_needed`): ``weights``
    extended by :func:`extended_weights` when it holds fewer, so at least :data:`MIN_BEYOND` replicates lie beyond
    each bootstrap-t bound (the percentile interval reads the same replicates).

    Returns one ``[lo, hi]`` per statistic, or ``None`` for every statistic when there are fewer
    than :data:`MIN_CLUSTERS` clusters (not estimable).
    """
    n = np.asarray(counts, dtype=np.float64)
    s = np.asarray(sums, dtype=np.float64)
    s2 = s[:, None] if s.ndim == 1 else s
    C = n.shape[0]
    k = s2.shape[1]
    if C < MIN_CLUSTERS:
        return [None] * k
    c_eff = effective_clusters(n)
    w = extended_weights(weights, replicates_needed(c_eff, alpha_lo, alpha_hi))
    w = w if w.dtype == np.float64 else w.astype(np.float64)
    a_lo, a_hi = calibrated_alpha(alpha_lo, c_eff), calibrated_alpha(alpha_hi, c_eff)
    block = max(1, _BLOCK_ELEMENTS // w.shape[0])
    lo = np.empty(k)
    hi = np.empty(k)
    for j in range(0, k, block):
        lo[j : j + block], hi[j : j + block] = _studentized_block(w, n, s2[:, j : j + block], alpha_lo, alpha_hi, a_lo, a_hi)
    lo = np.clip(lo, bounds[0], bounds[1])
    hi = np.clip(hi, bounds[0], bounds[1])
    return [[float(lo[j]), float(hi[j])] for j in range(k)]


def _studentized_block(
    w: np.ndarray, n: np.ndarray, s2: np.ndarray, alpha_lo: float, alpha_hi: float, a_lo: float, a_hi: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Unclipped lower and upper ends of :func:`ratio_intervals` for the statistics ``s2`` [C, k] (``a_lo``, ``a_hi``:
    the calibrated levels of the bootstrap-t quantiles). Replicates run along the rows' last axis ([k, B])."""
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
    del tmp, positive
    t_hi, t_lo = _row_quantiles(t, (1.0 - a_lo if alpha_lo > 0 else None, a_hi if alpha_hi > 0 else None))
    with np.errstate(invalid="ignore"):
        lo_t = np.where(se > 0, r - t_hi * se, r) if t_hi is not None else np.full(k, -np.inf)
        hi_t = np.where(se > 0, r - t_lo * se, r) if t_lo is not None else np.full(k, np.inf)
    p_lo, p_hi = _row_quantiles(d, (alpha_lo if alpha_lo > 0 else None, 1.0 - alpha_hi if alpha_hi > 0 else None))
    lo_p = r + p_lo if p_lo is not None else np.full(k, -np.inf)
    hi_p = r + p_hi if p_hi is not None else np.full(k, np.inf)
    return np.minimum(lo_t, lo_p), np.maximum(hi_t, hi_p)


def _row_quantiles(x: np.ndarray, qs: tuple[float | None, ...]) -> list[np.ndarray | None]:
    """numpy's "linear" quantiles of every row of ``x`` [k, B] at each ``q`` (None: not needed), from one partial
    sort of the rows (the order statistics around each ``q (B - 1)``)."""
    B = x.shape[1]
    idx: list[tuple[int, int, float]] = []
    for q in qs:
        if q is None:
            continue
        v = q * (B - 1)
        lo = min(max(int(math.floor(v)), 0), B - 1)
        idx.append((lo, min(lo + 1, B - 1), v - lo))
    kth = sorted({i for lo, hi, _ in idx for i in (lo, hi)})
    part = np.partition(x, kth, axis=1) if kth else x
    out: list[np.ndarray | None] = []
    it = iter(idx)
    for q in qs:
        if q is None:
            out.append(None)
            continue
        lo, hi, f = next(it)
        a, b = part[:, lo], part[:, hi]
        out.append(np.asarray(a + (b - a) * f if f < 0.5 else b - (b - a) * (1.0 - f), dtype=np.float64))
    return out


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
