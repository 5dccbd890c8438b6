"""Per-side misses of alternative mean intervals on heavy-tailed shapes (the comparison in docs/statistics.md).

Run by hand (minutes): ``python benchmarks/coverage_alternatives.py SHAPE REPS CLUSTERS`` with ``SHAPE`` one of
``pareto3`` (Pareto(3) cluster effects, skewed sizes), ``extreme`` (Pareto(2.5), 2 contexts each) or ``ln1.3skew``
(lognormal cluster log-sd 1.3, skewed sizes) and ``CLUSTERS`` a comma list, e.g.
``python benchmarks/coverage_alternatives.py extreme 4000 8,16,47,85``. Every candidate sees the same data sets
and the same 10,000 cluster draws:

* ``F/K``: per side the wider of the percentile interval and the bootstrap-t read at ``a F C'/(C' + K)`` (the
  harness's rule; ``1.0/0`` reads it at the stated ``a``);
* ``F/K+log``: additionally the bootstrap-t of ``log r`` (standard error ``se / r``), per side the widest;
* ``bca``: the bias-corrected and accelerated percentile interval (acceleration from the cluster jackknife).

It prints each side's miss rate with its Monte-Carlo standard error and the median upper half-width / mean.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
from coverage_unseen import Shape, cluster_sizes, draw_mean_data  # run as a script: benchmarks/ is on the path
from scipy.stats import norm

from harness.metrics.bootstrap import draw_cluster_weights, effective_clusters
from harness.metrics.simulation import EXTREME, ClusterModel

SHAPES = {
    "pareto3": Shape(ClusterModel("e", sigma_cluster=0.0, sigma_context=0.3, sigma_position=1.5, cluster_law="pareto",
                                  pareto_shape=3.0), skewed_sizes=True),
    "extreme": Shape(EXTREME),
    "ln1.3skew": Shape(ClusterModel("f", sigma_cluster=1.3, sigma_context=0.3, sigma_position=1.5), skewed_sizes=True),
}
LEVELS = ((0.5, 120.0), (0.4, 120.0), (0.3, 120.0), (0.5, 300.0), (0.25, 200.0), (1.0, 0.0))


def quantile_sorted(xs: np.ndarray, q: np.ndarray | float) -> np.ndarray:
    """numpy's "linear" quantile of every column of the column-sorted ``xs`` at ``q`` (scalar or one per column)."""
    B = xs.shape[0]
    pos = np.asarray(q) * (B - 1)
    i = np.clip(np.floor(pos).astype(np.int64), 0, B - 2)
    f = pos - i
    cols = np.arange(xs.shape[1])
    return np.asarray(xs[i, cols] * (1 - f) + xs[i + 1, cols] * f, dtype=np.float64)


def candidates(sums: np.ndarray, counts: np.ndarray, W: np.ndarray, a: float = 0.025) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Point estimates and each candidate's (lower, upper) ends for every column of ``sums`` [C, R]."""
    n = counts.astype(np.float64)
    C, N = n.shape[0], float(n.sum())
    r = sums.sum(axis=0) / N
    e = sums - n[:, None] * r[None, :]
    fac = C / (C - 1.0)
    se = np.sqrt(fac * (e**2).sum(axis=0)) / N
    Nb = W @ n
    d = (W @ e) / Nb[:, None]
    Q = W @ (e**2) - 2.0 * d * (W @ (e * n[:, None])) + d**2 * (W @ (n**2))[:, None]
    se_b = np.sqrt(fac * np.maximum(Q, 0.0)) / Nb[:, None]
    t = np.clip(d / np.where(se_b > 0, se_b, 1e-300), -1e12, 1e12)
    rb = r[None, :] + d
    with np.errstate(divide="ignore", invalid="ignore"):
        pos = np.maximum(rb, 1e-300)
        tl = np.clip(np.where(rb > 0, (np.log(pos) - np.log(r)[None, :]) / (se_b / pos), -1e12), -1e12, 1e12)
    ts, tls, rbs = np.sort(t, axis=0), np.sort(tl, axis=0), np.sort(rb, axis=0)
    ce = effective_clusters(n)
    p_lo, p_hi = quantile_sorted(rbs, a), quantile_sorted(rbs, 1 - a)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for f, K in LEVELS:
        ap = a * f * ce / (ce + K)
        lo = np.minimum(r - quantile_sorted(ts, 1 - ap) * se, p_lo)
        hi = np.maximum(r - quantile_sorted(ts, ap) * se, p_hi)
        out[f"{f:g}/{K:g}"] = (lo, hi)
        out[f"{f:g}/{K:g}+log"] = (np.minimum(r * np.exp(-quantile_sorted(tls, 1 - ap) * se / r), lo),
                                   np.maximum(r * np.exp(-quantile_sorted(tls, ap) * se / r), hi))
    z0 = norm.ppf(np.clip((rb < r[None, :]).mean(axis=0), 1e-6, 1 - 1e-6))
    dj = (sums.sum(axis=0)[None, :] - sums) / (N - n)[:, None]
    dj = dj.mean(axis=0)[None, :] - dj
    acc = (dj**3).sum(axis=0) / (6.0 * ((dj**2).sum(axis=0)) ** 1.5)
    ends = [quantile_sorted(rbs, np.clip(norm.cdf(z0 + (z0 + z) / (1 - acc * (z0 + z))), 0, 1))
            for z in (norm.ppf(a), norm.ppf(1 - a))]
    out["bca"] = (ends[0], ends[1])
    return r, out


def cell(shape: Shape, C: int, reps: int, seed: int, n_boot: int = 10_000) -> tuple[dict[str, tuple[float, float, float]], float]:
    sizes = cluster_sizes(C, shape.skewed_sizes, seed)
    rng = np.random.default_rng(seed + 1)
    W = draw_cluster_weights(C, n_boot, seed=seed + 2).astype(np.float64)
    acc: dict[str, list[float]] = {}
    halves: dict[str, list[np.ndarray]] = {}
    for r0 in range(0, reps, 250):
        sums, counts, truth = draw_mean_data(shape, rng, min(250, reps - r0), sizes)
        r, out = candidates(sums, counts, W)
        for k, (lo, hi) in out.items():
            m = acc.setdefault(k, [0.0, 0.0])
            m[0] += float((hi < truth).sum())
            m[1] += float((lo > truth).sum())
            halves.setdefault(k, []).append((hi - r) / r)
    res = {k: (v[0] / reps, v[1] / reps, float(np.median(np.concatenate(halves[k])))) for k, v in acc.items()}
    return res, float(sizes.max() / sizes.sum())


def main(name: str, reps: int, clusters: list[int]) -> None:
    for C in clusters:
        t0 = time.time()
        res, share = cell(SHAPES[name], C, reps, seed=91_000 + C + 7 * len(name))
        print(f"== {name} C={C} reps={reps} largest share={share:.2f} ({time.time() - t0:.0f}s)")
        for k, (below, above, half) in res.items():
            se = math.sqrt(max(below, 1e-4) * (1 - below) / reps)
            print(f"  {k:14s} upper end below {100 * below:5.2f} % ± {100 * se:.2f}  lower end above {100 * above:5.2f} %  "
                  f"upper half-width / mean {half:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), [int(c) for c in sys.argv[3].split(",")])
