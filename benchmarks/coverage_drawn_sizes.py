"""Each side's miss of the mean-KLD interval when the documents' sizes are drawn with the documents.

Run by hand (minutes per cell): ``python benchmarks/coverage_drawn_sizes.py SHAPES CLUSTERS REPS [OFFSET]``, e.g.
``python benchmarks/coverage_drawn_sizes.py a,b,o 16,47 1000`` (``SHAPES`` letters of ``coverage_unseen``'s
shapes with skewed sizes; prints one markdown row per cell; ``OFFSET`` is added to every seed). With ``--size-trend``
each row says instead how often the size-trend statistic (:func:`size_trend`) exceeds :data:`TREND_Z` and how often the
upper end misses where it does and where it does not (the same data sets: the same seeds draw them).

``coverage_unseen`` and ``coverage_alternatives`` fix each cell's cluster sizes once (a layout) and draw only the
effects: their truth is the mean over documents *of those sizes*. A suite's documents are drawn from a corpus, their
sizes with them, and what a report's interval claims is the corpus's mean ``E[s] / E[n]``. Where a cluster's
difficulty does not depend on its size the two agree; where it grows with size (``size_exponent``) the fixed layout
also fixes which documents are the big, hard ones, and its interval looks over-wide on both sides
(``docs/statistics.md``, 'Document sizes drawn with the documents'). Here every data set draws its own sizes
(:func:`coverage_unseen.draw_sizes`), difficulty ``g(n) = n^e / E[n^e]`` (the corpus's normalizer, exact from
:func:`size_pmf`), and the truth is the corpus's token mean ``MEAN E[g(n) n] / E[n]``, exact. Each data set's interval
is :func:`harness.metrics.bootstrap.ratio_intervals` with the production defaults (10,000 replicates, one draw per
cell, extended where a side is read lower), as ``coverage_unseen.mean_cell`` calls it.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from coverage_unseen import (  # run as a script: benchmarks/ is on the path
    HELD_OUT_SHAPES,
    IN_USE_SHAPES,
    MAX_SIZE,
    SHAPES,
    SIZE_LOG_MEAN,
    SIZE_LOG_SD,
    Shape,
    draw_sizes,
    rate,
)
from scipy.stats import norm

from harness.metrics.bootstrap import DEFAULT_N_BOOT, draw_cluster_weights, percentile_interval, ratio_intervals

#: The shapes by letter (the cluster model's name).
BY_LETTER = {s.model.name: s for s in SHAPES + IN_USE_SHAPES + HELD_OUT_SHAPES}
SEED = 91_000
#: Where :func:`size_trend` is said to show difficulty growing with size (a one-sided test at about 2.3 %).
TREND_Z = 2.0


def size_pmf() -> tuple[np.ndarray, np.ndarray]:
    """The sizes ``1..MAX_SIZE`` and their exact probabilities under :func:`coverage_unseen.draw_sizes` (a rounded,
    clipped lognormal: size ``k`` collects ``log`` values in ``[log(k - 1/2), log(k + 1/2))``, the ends open)."""
    k = np.arange(1, MAX_SIZE + 1)
    lo = np.where(k == 1, -np.inf, np.log(np.maximum(k - 0.5, 1e-300)))
    hi = np.where(k == MAX_SIZE, np.inf, np.log(k + 0.5))
    p = norm.cdf((hi - SIZE_LOG_MEAN) / SIZE_LOG_SD) - norm.cdf((lo - SIZE_LOG_MEAN) / SIZE_LOG_SD)
    return k, np.asarray(p, dtype=np.float64)


def corpus_difficulty(exponent: float) -> tuple[float, float]:
    """The corpus's normalizer ``E[n^e]`` of the difficulty and its token-weighted mean ``E[g(n) n] / E[n]``."""
    k, p = size_pmf()
    ge = k.astype(np.float64) ** exponent
    norm_e = float((p * ge).sum())
    return norm_e, float((p * ge / norm_e * k).sum() / (p * k).sum())


def drawn_data(shape: Shape, rng: np.random.Generator, C: int, norm_e: float) -> tuple[np.ndarray, np.ndarray]:
    """One data set of ``C`` documents with drawn sizes: per-cluster KLD sums and positions ``[C]``."""
    sizes = draw_sizes(rng, (C,))
    kmax = int(sizes.max())
    m = shape.model
    ctx = m.draw_contexts(rng, 1, C, kmax)[:, :, 0] * (np.arange(kmax)[None, :] < sizes[:, None])
    g = sizes.astype(np.float64) ** shape.size_exponent / norm_e
    return ctx.sum(axis=1) * g, sizes.astype(np.float64) * m.positions


def size_trend(sums: np.ndarray, counts: np.ndarray) -> float:
    """Whether a data set's difficulty grows with its clusters' size, as a z: the clusters split at the median size,
    ``log(R_big / R_small)`` over its delta-method standard error, ``R`` each half's ratio mean ``sum s / sum n`` with
    the cluster-robust variance ``k / (k - 1) sum (s - R n)^2 / (sum n)^2`` of its ``k`` clusters (0 where a half has
    fewer than 2 clusters or a mean or the error is not positive)."""
    big = counts > np.median(counts)
    parts = []
    for half in (big, ~big):
        k = int(half.sum())
        if k < 2:
            return 0.0
        s, n = sums[half], counts[half]
        r = float(s.sum() / n.sum())
        parts.append((r, k / (k - 1.0) * float(((s - r * n) ** 2).sum()) / float(n.sum()) ** 2))
    (r_big, v_big), (r_small, v_small) = parts
    if r_big <= 0 or r_small <= 0 or v_big + v_small <= 0:
        return 0.0
    return math.log(r_big / r_small) / math.sqrt(v_big / r_big**2 + v_small / r_small**2)


def drawn_cell(shape: Shape, C: int, reps: int, seed: int) -> dict[str, float]:
    """Each side's miss rate and the median width / the percentile interval's width over ``reps`` data sets, and the
    size trend's (:func:`size_trend`): the share of data sets where it exceeds :data:`TREND_Z` (``trend``) and the
    upper end's miss rate there (``below_if_trend``) and elsewhere (``below_if_not``; nan where there are none)."""
    norm_e, rel_truth = corpus_difficulty(shape.size_exponent)
    truth = shape.model.mean * rel_truth
    rng = np.random.default_rng(seed + 1)
    W = draw_cluster_weights(C, DEFAULT_N_BOOT, seed=seed + 2)
    above = 0
    below = np.zeros(reps, dtype=bool)
    trend = np.zeros(reps, dtype=bool)
    widths = np.empty(reps)
    for i in range(reps):
        sums, counts = drawn_data(shape, rng, C, norm_e)
        iv = ratio_intervals(W, sums, counts, bounds=(0.0, math.inf))[0]
        assert iv is not None  # C >= MIN_CLUSTERS
        below[i] = iv[1] < truth
        above += iv[0] > truth
        trend[i] = size_trend(sums, counts) > TREND_Z
        lo, hi = percentile_interval((W @ sums) / (W @ counts))
        widths[i] = (iv[1] - iv[0]) / (hi - lo)
    return {"below": float(below.mean()), "above": above / reps, "width": float(np.median(widths)),
            "trend": float(trend.mean()), "below_if_trend": float(below[trend].mean()) if trend.any() else math.nan,
            "below_if_not": float(below[~trend].mean()) if (~trend).any() else math.nan}


def _share(rate_: float, of: float, reps: int) -> str:
    """A miss rate among ``of * reps`` data sets, with how many there were."""
    n = round(of * reps)
    return "-" if n == 0 else f"{100 * rate_:.1f} % of {n}"


def main(letters: str, clusters: str, reps: int, offset: int = 0, trend: bool = False) -> None:
    if trend:
        print(f"| shape | clusters | data sets | upper end below the truth | size trend z > {TREND_Z:g} | upper miss "
              "where it is | where it is not |")
        print("|---|---|---|---|---|---|---|")
    else:
        print("| shape | clusters | data sets | upper end below the truth | lower end above it | width / percentile's |")
        print("|---|---|---|---|---|---|")
    for letter in letters.split(","):
        shape = BY_LETTER[letter]
        if not shape.skewed_sizes:
            raise SystemExit(f"shape {letter} ({shape.name}) has equal sizes: nothing to draw")
        for C in (int(c) for c in clusters.split(",")):
            r = drawn_cell(shape, C, reps, SEED + 1000 * (ord(letter) - ord("a")) + C + offset)
            if trend:
                print(f"| {letter}: {shape.name} | {C} | {reps} | {rate(r['below'], reps)} | {100 * r['trend']:.0f} % | "
                      f"{_share(r['below_if_trend'], r['trend'], reps)} | "
                      f"{_share(r['below_if_not'], 1.0 - r['trend'], reps)} |", flush=True)
            else:
                print(f"| {letter}: {shape.name} | {C} | {reps} | {rate(r['below'], reps)} | {rate(r['above'], reps)} | "
                      f"{r['width']:.2f} |", flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--size-trend"]
    if len(args) not in (3, 4):
        raise SystemExit(__doc__)
    main(args[0], args[1], int(args[2]), *(int(a) for a in args[3:4]), trend="--size-trend" in sys.argv[1:])
