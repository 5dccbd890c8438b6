"""Each side's miss of candidate mean-interval procedures on the same data sets (the comparison in docs/statistics.md).

Run by hand (minutes per set): ``python benchmarks/coverage_alternatives.py collect SET REPS CLUSTERS DIR`` with
``SET`` one of ``cal`` (the calibration models, 2 contexts per cluster), ``unseen`` (``coverage_unseen.SHAPES``),
``in_use`` (``IN_USE_SHAPES``), ``held`` (``HELD_OUT_SHAPES``) or ``typical`` (:data:`MILD` and two calibration
models) and ``CLUSTERS`` a comma list, e.g. ``python benchmarks/coverage_alternatives.py collect cal 1000
8,16,47,85,842 /tmp/alt`` (an optional last argument, e.g. :data:`FRESH_OFFSET`, is added to every seed: fresh data
sets and draws); then ``python benchmarks/coverage_alternatives.py table DIR summary|cells``.

``collect`` draws each cell's data sets (half from 100 clusters) as ``coverage_unseen`` does and, per data set on one
draw of 10,000 replicates (no extension), stores the bootstrap-t quantiles at a grid of levels (:data:`LEVELS`), the
percentile ends and what the level rule reads of the cluster residuals (skew, kurtosis, spread). ``table`` lets
every candidate read its levels from that grid (log-linear interpolation; a level below 0.0005 is read at 0.0005,
narrower than :func:`harness.metrics.bootstrap.ratio_intervals` reads it, so an upper miss is if anything
overstated), so all candidates see the same data sets and draws:

* ``previous``: per side the wider of the percentile interval and the bootstrap-t at ``0.25 a C'/(C' + 200)``;
* ``percentile``; ``bootstrap-t``: read at the stated ``a``;
* ``double bootstrap``: the fast double bootstrap (one inner replicate per outer one);
* ``before``: the upper end at ``a C'/(C' + 200 m) / (1 + 3 skew+ + 5 kurt)^2``, ``m = min(1, v / 0.6)^2`` (the rule
  the relative-standard-error rule replaced), the lower end at ``a min(2.4, 1 + 8 (se / r - 0.25)+)`` (before the
  lower end was scaled, :data:`BEFORE_LOWER_REL`; also the ``rel. SE`` candidates' lower end); ``rel. SE^2`` /
  ``rel. SE^4, no shape term``: the latter's relative standard error (squared over 0.04, or to the 4th power over
  0.1) and few-cluster terms without its skewness and kurtosis term;
* ``last``: the rule before both ends were scaled: the upper end at ``a / ((1 + (se / (0.1 r))^4) (1 + 10 / C') (1 +
  skew+ + 20 kurt)^2)``, the lower end as ``before``;
* ``now``: the harness's rule (:func:`harness.metrics.bootstrap.side_levels`, its module constants).

``table DIR sides`` prints each cell's upper and lower miss and width, ``last`` against ``now``, with the cell's
Monte-Carlo SE (docs/statistics.md, 'Both ends in the middle of the band').
"""

from __future__ import annotations

import glob
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from coverage_table import HEAVIER  # run as a script: benchmarks/ is on the path
from coverage_unseen import HELD_OUT_SHAPES, IN_USE_SHAPES, SHAPES, Shape, cluster_sizes, draw_mean_data

import harness.metrics.bootstrap as bs
from harness.metrics.simulation import ALL_MODELS, FIXTURE, HEAVY, ClusterModel

A = 0.025
LEVELS = np.array([0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0065, 0.008, 0.01, 0.0125, 0.015,
                   0.0175, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05, 0.06])
#: Typical shapes (``typical``): embedded-like (fixture-fitted), real-LLM-like tails with mild document effects (this
#: model) and with strong ones (heavy-tailed), 2 contexts per cluster, at 12, 16, 47 and 85 clusters.
MILD = ClusterModel("real-LLM-like, mild document effects", sigma_cluster=0.3, sigma_context=0.3, sigma_position=1.5)
SETS = {
    "cal": ([Shape(m) for m in ALL_MODELS[:2] + HEAVIER + ALL_MODELS[2:]], 61_000),
    "unseen": (list(SHAPES), 62_000),
    "in_use": (list(IN_USE_SHAPES), 63_000),
    "held": (list(HELD_OUT_SHAPES), 64_000),
    "typical": ([Shape(FIXTURE), Shape(MILD), Shape(HEAVY)], 65_000),
}
#: The rule the relative-standard-error rule replaced (``before``): ``a C'/(C' + 200 m) / (1 + 3 skew+ + 5 kurt)^2``,
#: ``m = min(1, v / 0.6)^2`` (also how differences were read before ``benchmarks/coverage_differences.py``'s rule).
BEFORE_CLUSTERS, BEFORE_SPREAD, BEFORE_SKEW, BEFORE_KURTOSIS = 200.0, 0.6, 3.0, 5.0
#: The lower end of a mean before its rule was scaled (``before`` and the ``rel. SE`` candidates): ``a min(2.4, 1 + 8
#: (se / r - 0.25)+)``, the stated level raised with the relative standard error.
BEFORE_LOWER_REL = 0.25
#: ``collect``'s optional last argument: added to every cell's seed (fresh data sets and draws for a confirmation).
FRESH_OFFSET = 1_000_000


def _grid_quantiles(xs: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Column quantiles ("linear") of the column-sorted ``xs`` [B, R] at each of ``p``: [R, len(p)]."""
    B = xs.shape[0]
    pos = p * (B - 1)
    i = np.clip(np.floor(pos).astype(np.int64), 0, B - 2)
    f = pos - i
    return np.asarray((xs[i] * (1 - f)[:, None] + xs[i + 1] * f[:, None]).T, dtype=np.float64)


def residuals(sums: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each data set's (column's) ratio mean ``r``, cluster residuals ``e`` [C, R] and CR1 standard error ``se``."""
    C, N = counts.shape[0], float(counts.sum())
    r = sums.sum(0) / N
    e = sums - counts[:, None] * r[None]
    return r, e, np.sqrt(C / (C - 1.0) * (e * e).sum(0)) / N


def replicates(W: np.ndarray, counts: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per draw (row of ``W``) and data set: ``r_b - r`` and the replicate's own CR1 standard error ``se_b``."""
    n, C = counts, counts.shape[0]
    Nb = W @ n
    d = (W @ e) / Nb[:, None]
    Q = W @ (e * e) - 2 * d * (W @ (e * n[:, None])) + d * d * (W @ (n * n))[:, None]
    return d, np.sqrt(C / (C - 1.0) * np.maximum(Q, 0)) / Nb[:, None]


def studentized(num: np.ndarray, se: np.ndarray) -> np.ndarray:
    """``num / se`` as the harness computes a replicate's ``t`` (``+-1e12`` where ``se`` is 0)."""
    return np.asarray(np.clip(np.divide(num, se, out=np.sign(num) * 1e12, where=se > 0), -1e12, 1e12), dtype=np.float64)


def collect_chunk(sums: np.ndarray, counts: np.ndarray, W: np.ndarray) -> dict[str, np.ndarray]:
    """What ``table`` reads of each data set (a column of ``sums``) on the draws ``W`` [B, C]."""
    n = counts
    N = float(n.sum())
    r, e, se = residuals(sums, n)
    d, seb = replicates(W, n, e)
    t = studentized(d, seb)
    # one inner replicate per outer one (fast double bootstrap): clusters redrawn from the outer replicate's
    W2 = _inner_weights(W, seed=int(W[0].sum() + W[:, 0].sum()))
    d2, seb2 = replicates(W2, n, e)
    t2 = studentized(d2 - d, seb2)
    t.sort(0)
    d.sort(0)
    t2.sort(0)
    shape = bs.ClusterShape.of(sums, n)
    e2 = e * e
    loo = (sums.sum(0)[None] - sums) / (N - n)[:, None] - r[None]  # r without cluster c, minus r
    return {"r": r, "se": se, "skew": shape.skew, "kurt": shape.kurt, "spread": shape.spread,
            "share_e2": e2.max(0) / np.maximum(e2.sum(0), 1e-300), "share_s": sums.max(0) / np.abs(sums).sum(0),
            "loo_up": -loo.min(0) / se, "loo_dn": loo.max(0) / se, "hill": _hill(sums / n[:, None]),
            "t2lo": _grid_quantiles(t2, LEVELS), "t2hi": _grid_quantiles(t2, 1 - LEVELS),
"tlo": _grid_quantiles(t, LEVELS), "thi": _grid_quantiles(t, 1 - LEVELS),
            "plo": _grid_quantiles(d, LEVELS) + r[:, None], "phi": _grid_quantiles(d, 1 - LEVELS) + r[:, None]}


def _hill(means: np.ndarray) -> np.ndarray:
    """Hill's estimate of the tail index of each column's cluster means from its top ``round(sqrt(C))`` values."""
    C = means.shape[0]
    k = max(2, int(round(math.sqrt(C))))
    top = -np.sort(-np.maximum(means, 1e-300), axis=0)[: k + 1]
    return np.asarray(1.0 / np.maximum(np.log(top[:k] / top[k]).mean(0), 1e-12), dtype=np.float64)


def _inner_weights(W: np.ndarray, seed: int) -> np.ndarray:
    """Per outer replicate (row of ``W``), one inner replicate: C clusters drawn with replacement from its own."""
    rng = np.random.default_rng(seed)
    B, C = W.shape
    cum = np.cumsum(W, axis=1)
    u = rng.integers(0, C, size=(B, C))  # position in the outer replicate's list of C drawn clusters
    idx = np.array([np.searchsorted(cum[b], u[b], side="right") for b in range(B)])
    out = np.zeros((B, C))
    np.add.at(out, (np.arange(B)[:, None], idx), 1.0)
    return out


def collect_cells(name: str, cases: Sequence[Any], base: int, reps: int, clusters: list[int], out: str,
                  chunk: Callable[[Any, np.random.Generator, int, np.ndarray, np.ndarray], dict[str, np.ndarray]]) -> None:
    """Every case x cluster count of a set: ``reps`` data sets (half from 100 clusters) in chunks of 250 on one draw of
    10,000 replicates, ``chunk(case, rng, reps, sizes, W)`` giving what the table reads of a chunk; one ``.npz`` per
    cell in ``out`` (``SET_CASE_CLUSTERS.npz``)."""
    os.makedirs(out, exist_ok=True)
    for i, case in enumerate(cases):
        for C in clusters:
            seed = base + 100 * i + C
            n = reps if C < 100 else reps // 2
            sizes = cluster_sizes(C, case.skewed_sizes, seed)
            rng = np.random.default_rng(seed + 1)
            W = bs.draw_cluster_weights(C, bs.DEFAULT_N_BOOT, seed=seed + 2).astype(np.float64)
            parts = [chunk(case, rng, min(250, n - r0), sizes, W) for r0 in range(0, n, 250)]
            cell = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            cell["c_eff"] = np.full(n, bs.effective_clusters(sizes.astype(np.float64)))
            cell["C"] = np.full(n, C)
            np.savez(os.path.join(out, f"{name}_{i}_{C}.npz"), **cell)
            print(name, i, C, case.name, flush=True)


def _mean_chunk(shape: Shape, rng: np.random.Generator, reps: int, sizes: np.ndarray, W: np.ndarray) -> dict[str, np.ndarray]:
    sums, counts, truth = draw_mean_data(shape, rng, reps, sizes)
    part = collect_chunk(sums, counts, W)
    part["truth"] = np.full(part["r"].shape, truth)
    return part


def collect(name: str, reps: int, clusters: list[int], out: str, offset: int = 0) -> None:
    shapes, base = SETS[name]
    collect_cells(name, shapes, base + offset, reps, clusters, out, _mean_chunk)


def _interp(arr: np.ndarray, level: np.ndarray) -> np.ndarray:
    ll = np.log(LEVELS)
    x = np.clip(np.log(level), ll[0], ll[-1])
    j = np.clip(np.searchsorted(ll, x) - 1, 0, len(ll) - 2)
    f = (x - ll[j]) / (ll[j + 1] - ll[j])
    rows = np.arange(arr.shape[0])
    return np.asarray(arr[rows, j] * (1 - f) + arr[rows, j + 1] * f, dtype=np.float64)


def _before_upper(o: dict[str, np.ndarray]) -> np.ndarray:
    """The upper end's level of the rule before the relative-standard-error rule (a right-skewed mean): ``a C'/(C' +
    200 m) / (1 + 3 skew+ + 5 kurt)^2``, ``m = min(1, v / 0.6)^2``, at the floor where the dominance diagnostic fires."""
    m = np.minimum(1.0, o["spread"] / BEFORE_SPREAD) ** 2
    ce = o["c_eff"]
    lev = A * ce / (ce + BEFORE_CLUSTERS * m) / (1 + BEFORE_SKEW * np.maximum(o["skew"], 0) + BEFORE_KURTOSIS * o["kurt"]) ** 2
    lev = np.where(bs.dominated(_shape(o)), 0.0, lev)
    return np.asarray(np.maximum(lev, A * bs.LEVEL_FLOOR), dtype=np.float64)


def _before_lower(o: dict[str, np.ndarray]) -> np.ndarray:
    """The lower end's level before it was scaled: ``a min(LOWER_CAP, 1 + LOWER_SLOPE (se / r - 0.25)+)``."""
    rel = o["spread"] / np.sqrt(o["c_eff"])
    return np.asarray(A * np.minimum(bs.LOWER_CAP, 1.0 + bs.LOWER_SLOPE * np.maximum(rel - BEFORE_LOWER_REL, 0.0)),
                      dtype=np.float64)


def _rel_se_upper(o: dict[str, np.ndarray], scale: float, power: float, few: float, kurt: float, shape_power: float) -> np.ndarray:
    """A relative-standard-error rule's upper level: ``a / ((1 + (se / (scale r))^power) (1 + few / C') (1 + skew+ +
    kurt kurt)^shape_power)`` (the harness's rule: ``scale`` 0.1, ``power`` 4, ``few`` 10, ``kurt`` 20,
    ``shape_power`` 2), at the floor where the dominance diagnostic fires."""
    ce = o["c_eff"]
    rel = o["spread"] / np.sqrt(ce)
    shape = (1 + np.maximum(o["skew"], 0) + kurt * o["kurt"]) ** shape_power
    lev = A / ((1 + (rel / scale) ** power) * (1 + few / ce) * shape)
    lev = np.where(bs.dominated(_shape(o)), 0.0, lev)
    return np.asarray(np.maximum(lev, A * bs.LEVEL_FLOOR), dtype=np.float64)


def _shape(o: dict[str, np.ndarray]) -> bs.ClusterShape:
    """The :class:`harness.metrics.bootstrap.ClusterShape` of every data set of a cell (one per column)."""
    return bs.ClusterShape(o["skew"], o["kurt"], o["spread"], o["share_s"], float(o["c_eff"][0]), int(o["C"][0]))


def _inverse_level(grid: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Per row, the level at which the monotone quantile ``grid`` [R, len(LEVELS)] reaches ``value`` (log-linear)."""
    ll = np.log(LEVELS)
    inc = grid[0, -1] >= grid[0, 0]
    return np.array([math.exp(np.interp(v, g if inc else g[::-1], ll if inc else ll[::-1])) for g, v in zip(grid, value)])


def double_bootstrap_levels(o: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The fast double bootstrap's levels (lower, upper): the share of inner ``t**`` beyond the outer ``t*`` quantile at
    ``a`` on each side (the level at which the outer quantile is read so that, in the bootstrap world, it misses ``a``)."""
    full = np.full(o["r"].shape, A)
    return _inverse_level(o["t2hi"], _interp(o["thi"], full)), _inverse_level(o["t2lo"], _interp(o["tlo"], full))


def candidate_ends(o: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each candidate's (lower, upper) ends of every data set of a cell (lower ends clipped at 0)."""
    r, se = o["r"], o["se"]
    full = np.full_like(r, A)
    p_lo, p_hi = _interp(o["plo"], full), _interp(o["phi"], full)

    def t_ends(a_lo: np.ndarray, a_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return r - _interp(o["thi"], a_lo) * se, r - _interp(o["tlo"], a_hi) * se

    ce = o["c_eff"]
    prev = A * 0.25 * ce / (ce + 200.0)
    lo_prev, hi_prev = t_ends(prev, prev)
    shape = _shape(o)
    rs = np.ones(r.shape[0], dtype=bool)
    out = {
        "previous": (np.minimum(lo_prev, p_lo), np.maximum(hi_prev, p_hi)),
        "percentile": (p_lo, p_hi),
        "bootstrap-t": t_ends(full, full),
        "double bootstrap": t_ends(*double_bootstrap_levels(o)),
        "before": t_ends(_before_lower(o), _before_upper(o)),
        "rel. SE^2, no shape term": t_ends(_before_lower(o), _rel_se_upper(o, 0.04, 2.0, 10.0, 0.0, 0.0)),
        "rel. SE^4, no shape term": t_ends(_before_lower(o), _rel_se_upper(o, 0.1, 4.0, 10.0, 0.0, 0.0)),
        "last": t_ends(_before_lower(o), _rel_se_upper(o, 0.1, 4.0, 10.0, 20.0, 2.0)),
        "now": t_ends(bs.side_levels(A, shape, -1, rs), bs.side_levels(A, shape, +1, rs)),
    }
    return {k: (np.maximum(lo, 0.0), hi) for k, (lo, hi) in out.items()}


def _marked(miss: float, se: float) -> str:
    """A miss in percent, marked HIGH / LOW where it lies outside [1.0 %, 2.5 %] by more than ``se``."""
    mark = " HIGH" if miss > A + se else " LOW" if miss < 0.01 - se else ""
    return f"{100 * miss:.2f} %{mark}"


def table(folder: str, kind: str) -> None:
    names = {k: [s.model.name if k in ("cal", "typical") else s.name for s in v[0]] for k, v in SETS.items()}
    rows: dict[str, list[tuple[str, str, int, int, float, float, float, float]]] = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.npz"))):
        name, i, C = os.path.basename(f)[:-4].rsplit("_", 2)
        o = dict(np.load(f))
        ends = candidate_ends(o)
        pw = ends["percentile"][1] - ends["percentile"][0]
        for k, (lo, hi) in ends.items():
            rows.setdefault(k, []).append((name, names[name][int(i)], int(C), lo.shape[0], float((hi < o["truth"]).mean()),
                                           float((lo > o["truth"]).mean()), float(np.median((hi - lo) / pw)),
                                           float(bs.dominated(_shape(o)).mean())))
    if kind == "summary":
        print("| procedure | set | cells | upper > 2.5 % + SE | upper < 1.0 % - SE | lower > 2.5 % + SE | lower < 1.0 % - SE "
              "| largest upper miss | median width / percentile's |")
        print("|---|---|---|---|---|---|---|---|---|")
        for k, rs in rows.items():
            for s in SETS:
                sel = [x for x in rs if x[0] == s]
                if not sel:
                    continue
                se = np.array([math.sqrt(A * (1 - A) / x[3]) for x in sel])
                up, dn = np.array([x[4] for x in sel]), np.array([x[5] for x in sel])
                print(f"| {k} | {s} | {len(sel)} | {(up > A + se).sum()} | {(up < 0.01 - se).sum()} | {(dn > A + se).sum()} | "
                      f"{(dn < 0.01 - se).sum()} | {100 * up.max():.1f} % | {np.median([x[6] for x in sel]):.2f} |")
        return
    if kind == "sides":
        print("| set | shape | clusters | data sets | upper end below the truth: last / now | lower end above it: last / now "
              "| width / percentile's: last / now | SE |")
        print("|---|---|---|---|---|---|---|---|")
        key = {s: i for i, s in enumerate(SETS)}
        for b, c in sorted(zip(rows["last"], rows["now"]), key=lambda z: (key[z[0][0]], names[z[0][0]].index(z[0][1]), z[0][2])):
            se = math.sqrt(A * (1 - A) / c[3])
            print(f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | {_marked(b[4], se)} / **{_marked(c[4], se)}** | "
                  f"{_marked(b[5], se)} / **{_marked(c[5], se)}** | {b[6]:.2f} / **{c[6]:.2f}** | {100 * se:.2f} |")
        return
    print("| set | shape | clusters | data sets | upper end below the truth: before / now | lower end above: before / now "
          "| width / percentile's: before / now | diagnostic fired |")
    print("|---|---|---|---|---|---|---|---|")
    key = {s: i for i, s in enumerate(SETS)}
    fires = {(x[0], x[1], x[2]): x[7] for x in rows["now"]}
    for b, c in sorted(zip(rows["before"], rows["now"]), key=lambda z: (key[z[0][0]], names[z[0][0]].index(z[0][1]), z[0][2])):
        print(f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | {100 * b[4]:.1f} / **{100 * c[4]:.1f}** % | "
              f"{100 * b[5]:.1f} / **{100 * c[5]:.1f}** % | {b[6]:.2f} / **{c[6]:.2f}** | {100 * fires[c[:3]]:.1f} % |")


if __name__ == "__main__":
    if sys.argv[1] == "collect":
        collect(sys.argv[2], int(sys.argv[3]), [int(c) for c in sys.argv[4].split(",")], sys.argv[5],
                int(sys.argv[6]) if len(sys.argv) > 6 else 0)
    else:
        table(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "summary")
