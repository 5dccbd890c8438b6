"""Each side's miss rate of the harness's intervals on shapes the calibration never saw.

Run by hand (minutes): ``python benchmarks/coverage_unseen.py [mean_reps] [tail_reps] [shapes]``, ``shapes``
the letters of the shapes to run (``SHAPES`` are ``a``-``e``, ``IN_USE_SHAPES`` ``f``-``j``, ``HELD_OUT_SHAPES``
``k``-``o``; all when absent); one tail cell: ``python benchmarks/coverage_unseen.py tails a|d|n REPS CHUNK`` (a
line of JSON; chunks 0, 1, 2 ... are further data sets of the same cell, so runs of a few minutes add up). Every
cell differs from the calibration table (``benchmarks/coverage_table.py``: equal-sized clusters at 8, 16, 47, 85
and 842) in at least one of

* the cluster count (10, 20, 30, 64, 150, 400),
* cluster sizes: skewed (contexts per cluster lognormal, 1 to 40, fixed per layout as a suite's are),
  optionally with difficulty that grows with size (larger documents harder),
* tails: lognormal position KLD with log-sd 2.5, Pareto(3) cluster effects;

five further shapes at the cluster counts in use (8, 16, 47, 85, 842): lognormal cluster effects of log-sd 1.3
with skewed sizes, a mixture where 5 % of clusters are 20 times harder, Pareto(2.2) cluster effects with skewed
sizes, difficulty proportional to size (one document holding up to 40 % of the KLD), and lognormal 0.9 / 0.8 /
2.0; and five shapes held out from the choice of the level rule (``HELD_OUT_SHAPES``, at 8, 12, 16, 47, 85, 842).
Each mean cell runs the same data sets and draws through the previous rule
(:func:`harness.metrics.simulation.previous_rule_intervals`) and the current one.

Each data set's interval comes from the production functions with the production defaults: the mean's
from :func:`ratio_intervals` (10,000 replicates, as every shard report draws), the tails' (p99, CVaR1%)
from :func:`tail_replicates` on per-position values (2,000 replicates, as :mod:`harness.metrics.summary`
draws them; the percentile interval read at each of :data:`TAIL_LEVELS` per side, the harness's
``TAIL_ALPHA`` among them). The truth is exact: the mean of every effect is 1, so the token
mean is ``mean`` (or the size-weighted design mean when difficulty grows with size); per-position values
are products of independent lognormals, so their pooled law is lognormal with the summed log-variance,
whose p99 and CVaR1% are closed-form.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from harness.metrics.bootstrap import (
    DEFAULT_N_BOOT,
    DEFAULT_N_BOOT_TAILS,
    TailData,
    draw_cluster_weights,
    percentile_interval,
    ratio_intervals,
    tail_replicates,
)
from harness.metrics.simulation import ClusterModel, previous_rule_intervals

POSITIONS = 255
MEAN = 1e-3

def rate(x: float, n: int) -> str:
    """A miss rate in percent with its Monte-Carlo standard error over ``n`` data sets."""
    return f"{100 * x:.2f} % ± {100 * math.sqrt(max(x, 1e-4) * (1 - x) / n):.2f}"


@dataclass(frozen=True)
class Shape:
    """One simulated shape: effects (a :class:`ClusterModel`), cluster sizes and difficulty by size."""

    model: ClusterModel
    skewed_sizes: bool = False
    size_exponent: float = 0.0  # cluster difficulty proportional to size**exponent (0: independent)

    @property
    def name(self) -> str:
        m = self.model
        law = {"pareto": f"Pareto({m.pareto_shape:g})",
               "mixture": f"{m.sigma_cluster:g} x ({100 * m.hard_fraction:g} % of clusters {m.hard_ratio:g}x)"}.get(
            m.cluster_law, f"{m.sigma_cluster:g}")
        sizes = "skewed sizes" if self.skewed_sizes else "2 contexts each"
        extra = f", difficulty ~ size^{self.size_exponent:g}" if self.size_exponent else ""
        return f"{law} / {m.sigma_context:g} / {m.sigma_position:g}, {sizes}{extra}"


#: Skewed cluster sizes: contexts per cluster ``rint(lognormal(SIZE_LOG_MEAN, SIZE_LOG_SD))`` clipped to
#: ``1..MAX_SIZE`` (a few large documents).
SIZE_LOG_MEAN, SIZE_LOG_SD, MAX_SIZE = 0.8, 0.9, 40


def draw_sizes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Skewed cluster sizes (contexts per cluster) of the given array shape from ``rng``."""
    return np.clip(np.rint(rng.lognormal(SIZE_LOG_MEAN, SIZE_LOG_SD, shape)), 1, MAX_SIZE).astype(np.int64)


def cluster_sizes(n_clusters: int, skewed: bool, seed: int) -> np.ndarray:
    """Contexts per cluster: 2 each, or skewed (:func:`draw_sizes`) from ``seed``, fixed per layout."""
    if not skewed:
        return np.full(n_clusters, 2, dtype=np.int64)
    return draw_sizes(np.random.default_rng(seed), (n_clusters,))


def difficulty(sizes: np.ndarray, exponent: float) -> np.ndarray:
    """Per-cluster difficulty factor (fixed by the design) and its size-weighted mean."""
    g = sizes.astype(np.float64) ** exponent
    return np.asarray(g / g.mean(), dtype=np.float64)


def draw_mean_data(shape: Shape, rng: np.random.Generator, reps: int, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-cluster KLD sums ``[C, reps]``, positions ``[C]`` and the true token mean."""
    m, C, kmax = shape.model, sizes.shape[0], int(sizes.max())
    mask = (np.arange(kmax)[None, :] < sizes[:, None]).astype(np.float64)[:, :, None]
    ctx = m.draw_contexts(rng, reps, C, kmax) * mask  # effects with expectation 1 times MEAN * POSITIONS
    g = difficulty(sizes, shape.size_exponent)
    sums = ctx.sum(axis=1) * g[:, None]
    counts = sizes.astype(np.float64) * m.positions
    truth = float(m.mean * (g * counts).sum() / counts.sum())
    return sums, counts, truth


def mean_cell(shape: Shape, C: int, reps: int, seed: int) -> dict[str, float]:
    """Each side's miss rate and the median width / the percentile interval's width, of the harness's interval
    (``now``) and of the previous rule (``before``) on the same data sets and draws."""
    sizes = cluster_sizes(C, shape.skewed_sizes, seed)
    rng = np.random.default_rng(seed + 1)
    W = draw_cluster_weights(C, DEFAULT_N_BOOT, seed=seed + 2)
    miss = {"below": 0, "above": 0, "below_before": 0, "above_before": 0}
    widths: dict[str, list[np.ndarray]] = {"": [], "_before": []}
    chunk = 250 if C >= 40 else 50
    for r0 in range(0, reps, chunk):
        sums, counts, truth = draw_mean_data(shape, rng, min(chunk, reps - r0), sizes)
        before, pct = previous_rule_intervals(W, sums, counts)
        now = np.array(ratio_intervals(W, sums, counts, bounds=(0.0, np.inf)), dtype=np.float64)
        pw = pct[:, 1] - pct[:, 0]
        for tag, iv in (("", now), ("_before", before)):
            miss["below" + tag] += int((iv[:, 1] < truth).sum())
            miss["above" + tag] += int((iv[:, 0] > truth).sum())
            widths[tag].append((iv[:, 1] - iv[:, 0]) / pw)
    out = {k: v / reps for k, v in miss.items()}
    out.update({"width" + k: float(np.median(np.concatenate(v))) for k, v in widths.items()})
    out["largest_share"] = float(sizes.max() / sizes.sum())
    return out


def lognormal_tails(mean: float, sigma: float, q: float = 0.99) -> tuple[float, float]:
    """Exact p_q and CVaR_(1-q) of a lognormal with this mean and log-sd."""
    mu = math.log(mean) - 0.5 * sigma * sigma
    z = float(norm.ppf(q))
    return math.exp(mu + sigma * z), mean * float(norm.cdf(sigma - z)) / (1.0 - q)


TAIL_LEVELS = (0.01, 0.005, 0.0025)


def tail_cell(shape: Shape, C: int, reps: int, seed: int, chunk: int = 0) -> dict[str, float]:
    """Per-position data sets; misses of the p99 and CVaR1% percentile intervals read at each of
    :data:`TAIL_LEVELS` per side, from the production replicates (``chunk``: another stream of data sets on
    the same layout and draws, so chunks add up)."""
    m = shape.model
    if m.cluster_law != "lognormal" or shape.size_exponent:
        raise ValueError("tail truth is closed-form only for independent lognormal effects")
    sizes = cluster_sizes(C, shape.skewed_sizes, seed)
    sigma = math.sqrt(m.sigma_cluster**2 + m.sigma_context**2 + m.sigma_position**2)
    p99, cvar1 = lognormal_tails(m.mean, sigma)
    rng = np.random.default_rng(seed + 1 + 7919 * chunk)
    W = draw_cluster_weights(C, DEFAULT_N_BOOT, seed=seed + 2)[:DEFAULT_N_BOOT_TAILS]
    ctx_cluster = np.repeat(np.arange(C), sizes)
    pos_cluster = np.repeat(ctx_cluster, m.positions)
    n_ctx = ctx_cluster.shape[0]
    miss = {f"{k}_{a:g}": 0 for k in ("p99_below", "p99_above", "cvar_below", "cvar_above") for a in TAIL_LEVELS}

    def unit(sig: float, size: int | tuple[int, ...]) -> np.ndarray:
        return np.asarray(rng.lognormal(-0.5 * sig * sig, sig, size), dtype=np.float64)

    for _ in range(reps):
        u = unit(m.sigma_cluster, C)[ctx_cluster] * unit(m.sigma_context, n_ctx)
        v = m.mean * np.repeat(u, m.positions) * unit(m.sigma_position, n_ctx * m.positions)
        qr, cr = tail_replicates(TailData.build(v, pos_cluster, C), W, 0.99, 0.01)
        for a in TAIL_LEVELS:
            (ql, qh), (cl, ch) = (percentile_interval(x, 1.0 - 2.0 * a) for x in (qr, cr))
            miss[f"p99_below_{a:g}"] += qh < p99
            miss[f"p99_above_{a:g}"] += ql > p99
            miss[f"cvar_below_{a:g}"] += ch < cvar1
            miss[f"cvar_above_{a:g}"] += cl > cvar1
    return {k: v / reps for k, v in miss.items()}


SHAPES = (
    Shape(ClusterModel("a", sigma_cluster=0.6, sigma_context=0.3, sigma_position=1.5), skewed_sizes=True),
    Shape(ClusterModel("b", sigma_cluster=0.6, sigma_context=0.3, sigma_position=1.5), skewed_sizes=True, size_exponent=0.5),
    Shape(ClusterModel("c", sigma_cluster=0.7, sigma_context=0.4, sigma_position=2.5)),
    Shape(ClusterModel("d", sigma_cluster=0.7, sigma_context=0.4, sigma_position=2.5), skewed_sizes=True),
    Shape(ClusterModel("e", sigma_cluster=0.0, sigma_context=0.3, sigma_position=1.5, cluster_law="pareto", pareto_shape=3.0),
          skewed_sizes=True),
)
MEAN_CLUSTERS = (10, 20, 30, 64, 150, 400)
#: Shapes run at the cluster counts in use (one shard, ladders, the seed suite) instead.
IN_USE_SHAPES = (
    Shape(ClusterModel("f", sigma_cluster=1.3, sigma_context=0.3, sigma_position=1.5), skewed_sizes=True),
    Shape(ClusterModel("g", sigma_cluster=0.3, sigma_context=0.3, sigma_position=1.5, cluster_law="mixture")),
    Shape(ClusterModel("h", sigma_cluster=0.0, sigma_context=0.3, sigma_position=1.5, cluster_law="pareto", pareto_shape=2.2),
          skewed_sizes=True),
    Shape(ClusterModel("i", sigma_cluster=1.0, sigma_context=0.3, sigma_position=1.5), skewed_sizes=True, size_exponent=1.0),
    Shape(ClusterModel("j", sigma_cluster=0.9, sigma_context=0.8, sigma_position=2.0)),
)
IN_USE_CLUSTERS = (8, 16, 47, 85, 842)
#: Shapes held out from the choice of the level rule (fixed before any of them was simulated): cluster effects
#: lognormal 0.45 with wide contexts, Pareto(4), a mixture where 20 % of the clusters are 4 times harder, lognormal
#: 1.1 / 0.5 / 2.2, and mild difficulty growing with size.
HELD_OUT_SHAPES = (
    Shape(ClusterModel("k", sigma_cluster=0.45, sigma_context=0.6, sigma_position=1.8), skewed_sizes=True),
    Shape(ClusterModel("l", sigma_cluster=0.0, sigma_context=0.4, sigma_position=1.2, cluster_law="pareto", pareto_shape=4.0)),
    Shape(ClusterModel("m", sigma_cluster=0.2, sigma_context=0.2, sigma_position=1.0, cluster_law="mixture", hard_fraction=0.2,
                       hard_ratio=4.0), skewed_sizes=True),
    Shape(ClusterModel("n", sigma_cluster=1.1, sigma_context=0.5, sigma_position=2.2)),
    Shape(ClusterModel("o", sigma_cluster=0.3, sigma_context=0.15, sigma_position=1.0), skewed_sizes=True, size_exponent=0.5),
)
HELD_OUT_CLUSTERS = (8, 12, 16, 47, 85, 842)
#: The tails' shapes at 250 clusters (skewed sizes) and the seed of each (layout and draws; ``a`` and ``d`` share
#: theirs): the two shapes of the earlier tail check and a heavier one.
TAIL_SHAPES = {
    "a": (SHAPES[0], 47_251),
    "d": (SHAPES[3], 47_251),
    "n": (Shape(ClusterModel("n", sigma_cluster=0.9, sigma_context=0.5, sigma_position=2.0), skewed_sizes=True), 47_253),
}
TAIL_CLUSTERS = 250


def main(mean_reps: int = 2000, tail_reps: int = 200, shapes: str = "abcdefghijklmno") -> None:
    """The mean table with ``mean_reps`` data sets per cell (half from 100 clusters) for the shapes named in
    ``shapes``, then the tails table with ``tail_reps`` (none when 0)."""
    print("Mean KLD, 95 % interval (each side stated at 2.5 %); before: the previous rule "
          "(harness.metrics.simulation.previous_rule_intervals), now: harness.metrics.bootstrap.ratio_intervals:\n")
    print("| shape | clusters | largest cluster's share | data sets | upper end below the truth: before | now | "
          "lower end above: before | now | width / percentile interval's: before / now |")
    print("|---|---|---|---|---|---|---|---|---|")
    cells = [(i, s, C) for i, s in enumerate(SHAPES) for C in MEAN_CLUSTERS]
    cells += [(len(SHAPES) + i, s, C) for i, s in enumerate(IN_USE_SHAPES) for C in IN_USE_CLUSTERS]
    cells += [(20 + i, s, C) for i, s in enumerate(HELD_OUT_SHAPES) for C in HELD_OUT_CLUSTERS]
    for i, shape, C in cells:
        if shape.model.name not in shapes:
            continue
        n = mean_reps if C < 100 else mean_reps // 2
        r = mean_cell(shape, C, n, seed=31_000 + 100 * i + C)
        cols = " | ".join(rate(r[k], n) for k in ("below_before", "below", "above_before", "above"))
        print(f"| {shape.name} | {C} | {r['largest_share']:.2f} | {n} | {cols} | "
              f"{r['width_before']:.2f} / {r['width']:.2f} |", flush=True)
    if tail_reps <= 0:
        return
    print(f"\nTails ({TAIL_CLUSTERS} clusters, {DEFAULT_N_BOOT_TAILS} replicates), {tail_reps} data sets per cell:\n")
    for key in TAIL_SHAPES:
        tails(key, tail_reps, 0)


def tails(key: str, reps: int, chunk: int) -> None:
    """One tail cell (a line of JSON: the shape, the data sets and each miss rate per level)."""
    shape, seed = TAIL_SHAPES[key]
    t = tail_cell(shape, TAIL_CLUSTERS, reps, seed, chunk)
    print(json.dumps({"shape": shape.name, "clusters": TAIL_CLUSTERS, "reps": reps, "chunk": chunk, **t}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["tails"]:
        tails(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main(*(int(a) for a in sys.argv[1:3]), *sys.argv[3:4])
