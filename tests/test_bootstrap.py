"""Validity of the source-cluster bootstrap: simulation, independent float64 checks, the not-estimable rule.

The percentile interval alone undercovers when clusters are few and their effects skewed; the
harness's interval is studentized (``harness.metrics.bootstrap.ratio_intervals``). The coverage
at 16, 47 and 800 clusters is measured in the ``slow`` tier (``tests/test_coverage.py``); this
module keeps a quick check at 300 clusters against the i.i.d. interval's failure.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.metrics.bootstrap import (
    MEAN_METHOD_TEXT,
    MIN_CLUSTERS,
    ClusterShape,
    draw_cluster_weights,
    extended_weights,
    method_text,
    ratio_interval,
    ratio_intervals,
    ratio_intervals_read,
    ratio_replicates,
    read_rows,
    replicates_needed,
    side_levels,
)

N_REPEATS = 400
N_BOOT = 1000
N_CLUSTERS = 300
CONTEXTS_PER_CLUSTER = 3
POSITIONS_PER_CONTEXT = 20
TRUE_MEAN = 0.01


def _simulate(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """KLD-like positive values with a strong cluster effect; E[value] = TRUE_MEAN for every position."""
    per_cluster = CONTEXTS_PER_CLUSTER * POSITIONS_PER_CONTEXT
    sigma_c, sigma_p = 0.6, 0.5
    u = rng.normal(0, sigma_c, N_CLUSTERS)
    e = rng.normal(0, sigma_p, (N_CLUSTERS, per_cluster))
    mu = np.log(TRUE_MEAN) - 0.5 * (sigma_c**2 + sigma_p**2)  # lognormal mean = TRUE_MEAN
    values = np.exp(mu + u[:, None] + e).ravel()
    cluster = np.repeat(np.arange(N_CLUSTERS), per_cluster)
    return values, cluster


def test_cluster_bootstrap_covers_truth_iid_does_not() -> None:
    rng = np.random.default_rng(12345)
    cover_cluster = cover_iid = 0
    for rep in range(N_REPEATS):
        values, cluster = _simulate(rng)
        sums = np.bincount(cluster, weights=values, minlength=N_CLUSTERS)
        counts = np.bincount(cluster, minlength=N_CLUSTERS)
        w = draw_cluster_weights(N_CLUSTERS, N_BOOT, seed=rep)
        lo, hi = ratio_interval(w, sums, counts)
        cover_cluster += lo <= TRUE_MEAN <= hi
        se = values.std(ddof=1) / np.sqrt(values.size)  # the i.i.d. interval (llama.cpp's)
        m = values.mean()
        cover_iid += m - 1.96 * se <= TRUE_MEAN <= m + 1.96 * se
    rate_cluster = cover_cluster / N_REPEATS
    rate_iid = cover_iid / N_REPEATS
    print(f"coverage of the nominal 95% interval: cluster bootstrap {rate_cluster:.3f}, i.i.d. {rate_iid:.3f}")
    assert rate_cluster >= 0.93, f"cluster bootstrap coverage {rate_cluster:.3f} < min 0.93"
    assert rate_iid < rate_cluster, f"i.i.d. coverage {rate_iid:.3f} >= cluster coverage {rate_cluster:.3f}"


def test_draws_are_multinomial_multiplicities() -> None:
    w = draw_cluster_weights(50, 2000, seed=1)
    assert w.shape == (2000, 50)
    assert (w.sum(1) == 50).all()
    assert abs(w.mean() - 1.0) < 1e-12
    assert abs(w.var() - (1 - 1 / 50)) < 0.02  # binomial(50, 1/50) variance


def test_ratio_of_sums_equals_expanded_mean() -> None:
    rng = np.random.default_rng(2)
    values = rng.random(300)
    cluster = rng.integers(0, 12, 300)
    w = draw_cluster_weights(12, 5, seed=3)
    rep = ratio_replicates(w, np.bincount(cluster, weights=values, minlength=12), np.bincount(cluster, minlength=12))
    for b in range(5):
        expanded = np.repeat(values, w[b][cluster])
        assert abs(rep[b] - expanded.mean()) < 1e-12


@pytest.mark.parametrize("right_skewed", [False, True])
@pytest.mark.parametrize("n_clusters", [8, 16, 47])
def test_studentized_interval_matches_an_independent_float64_implementation(reference_interval, n_clusters: int,
                                                                            right_skewed: bool) -> None:
    """ratio_interval (matrix products, expanded residual sums, the level rule) against explicit resampled positions."""
    rng = np.random.default_rng(n_clusters)
    cluster = rng.integers(0, n_clusters, 600)
    cluster[:n_clusters] = np.arange(n_clusters)  # every cluster present
    values = rng.lognormal(-7, 1.5, 600) * rng.lognormal(0, 0.7, n_clusters)[cluster]
    w = draw_cluster_weights(n_clusters, 400, seed=5)
    sums = np.bincount(cluster, weights=values, minlength=n_clusters)
    counts = np.bincount(cluster, minlength=n_clusters)
    got = ratio_interval(w, sums, counts, bounds=(0.0, math.inf) if right_skewed else (-math.inf, math.inf))
    want = reference_interval(values, cluster, w, right_skewed=right_skewed)
    assert got == pytest.approx(want, rel=1e-9)
    assert got[1] - got[0] > 0


def test_levels_follow_the_clusters_spread_and_skew() -> None:
    """side_levels against the documented formula, computed here from the residuals: the upper end of a right-skewed
    mean at ``0.9 a / ((1 + (se / (0.1 r))^4) (1 + 10 / C') (1 + skew+ + 16 kurt)^2)`` (a homogeneous suite near the stated
    level, a spread-out skewed one far below it), its lower end at 0.7 times the stated level, raised with its relative
    standard error (``0.7 a min(2.4, 1 + 8 (se / r - 0.15)+)``), each end of a statistic of unknown skew at
    ``0.8 a min(2.4, 1 + 5 skew-) / ((1 + 8 / C') (1 + 3 (1 + 60 / C') skew+ + 10 kurt)^2)``."""
    rng = np.random.default_rng(3)
    C = 47
    counts = np.full(C, 500.0)
    homogeneous = counts * 1e-3 * rng.lognormal(0.0, 0.1, C)
    skewed = counts * 1e-3 * rng.lognormal(0.0, 1.2, C)
    sums = np.stack([homogeneous, skewed], axis=1)
    shape = ClusterShape.of(sums, counts)
    up = side_levels(0.025, shape, +1, np.array([True, True]))
    down = side_levels(0.025, shape, -1, np.array([True, True]))
    for j, s in enumerate((homogeneous, skewed)):
        r = s.sum() / counts.sum()
        e = s - r * counts
        g = (e**3).sum() / (e**2).sum() ** 1.5
        x = max(C * (e**4).sum() / (e**2).sum() ** 2 - 3.0, 0.0) / C
        se_r = np.sqrt(C / (C - 1) * (e**2).sum()) / counts.sum() / r
        want = max(0.9 * 0.025 / ((1 + (se_r / 0.1) ** 4) * (1 + 10 / C) * (1 + max(g, 0.0) + 16 * x) ** 2), 0.025 / 100)
        assert up[j] == pytest.approx(want, rel=1e-12)
        assert down[j] == pytest.approx(0.7 * 0.025 * min(2.4, 1 + 8 * max(se_r - 0.15, 0.0)), rel=1e-12)
        unknown = side_levels(0.025, shape, -1, np.array([False, False]))[j]
        # a statistic of unknown skew: the few-cluster term, the skew toward that end (weighted up with few
        # clusters) and the kurtosis; the skew away from it raises the level
        heavy = (1 + 3 * (1 + 60 / C) * max(-g, 0.0) + 10 * x) ** 2
        want_unknown = 0.8 * 0.025 * min(2.4, 1 + 5 * max(g, 0.0)) / ((1 + 8 / C) * heavy)
        assert unknown == pytest.approx(max(want_unknown, 0.025 / 100), rel=1e-12)
    # over 40 data sets of each: a homogeneous suite is read near the stated level, a spread-out skewed one far below
    many = np.concatenate([counts[:, None] * 1e-3 * rng.lognormal(0.0, sd, (C, 40)) for sd in (0.1, 1.2)], axis=1)
    levels = side_levels(0.025, ClusterShape.of(many, counts), +1, np.ones(80, dtype=bool))
    homogeneous_level, skewed_level = float(np.median(levels[:40])), float(np.median(levels[40:]))
    assert homogeneous_level > 0.5 * 0.025 and skewed_level < homogeneous_level / 5


@pytest.mark.parametrize("n_clusters", [8, 16, 85, 842])
def test_each_bootstrap_t_bound_has_at_least_20_replicates_beyond_it(n_clusters: int) -> None:
    """The documented count: each side's quantile read from the draws doubled until >= 20 / level replicates lie
    beyond it, the report's own draws first (the same extension for the same draws)."""
    rng = np.random.default_rng(n_clusters)
    counts = np.full(n_clusters, 100.0)
    sums = counts * rng.lognormal(0.0, 1.0, n_clusters)
    shape = ClusterShape.of(sums[:, None], counts)
    a_hi = float(side_levels(0.025, shape, +1, np.array([True]))[0])
    need = replicates_needed(np.array([a_hi]))
    assert need == math.ceil(20 / a_hi - 1e-9) and need * a_hi >= 20 > (need - 1) * a_hi
    assert replicates_needed(np.array([0.0, 0.0])) == 0
    rows = read_rows(2000, need)
    assert rows >= need and (rows == 2000 or rows // 2 < need) and rows % 2000 == 0
    w = draw_cluster_weights(n_clusters, 2000, seed=4)
    ext = extended_weights(w, rows)
    assert ext.shape == (max(2000, rows), n_clusters) and (ext[:2000] == w).all()
    assert (ext.sum(axis=1) == n_clusters).all() and (ext >= 0).all()
    assert (extended_weights(w.copy(), rows) == ext).all()
    if rows > 2000:  # the extension differs from the first rows (fresh draws, not copies)
        extra = ext[2000 : 2000 + min(2000, rows - 2000)]
        assert not (extra == w[: len(extra)]).all()


def test_a_statistic_does_not_depend_on_the_others_of_its_call() -> None:
    """Each statistic reads its own number of replicates: alone or next to a heavily skewed one, the same interval."""
    rng = np.random.default_rng(9)
    counts = np.full(16, 100.0)
    mild = counts * rng.lognormal(0.0, 0.1, 16)
    wild = counts * rng.pareto(1.5, 16)
    w = draw_cluster_weights(16, 2000, seed=1)
    together = ratio_intervals(w, np.stack([mild, wild], axis=1), counts, bounds=(0.0, math.inf))
    assert together[0] == pytest.approx(ratio_interval(w, mild, counts, bounds=(0.0, math.inf)), rel=1e-12)
    assert together[1] == pytest.approx(ratio_interval(w, wild, counts, bounds=(0.0, math.inf)), rel=1e-12)


def test_below_the_minimum_clusters_nothing_is_estimable() -> None:
    w = draw_cluster_weights(MIN_CLUSTERS - 1, 100, seed=1)
    assert ratio_intervals(w, np.ones((MIN_CLUSTERS - 1, 3)), np.ones(MIN_CLUSTERS - 1)) == [None, None, None]


def test_one_sided_bounds_and_identical_clusters() -> None:
    w = draw_cluster_weights(10, 500, seed=2)
    counts = np.full(10, 5.0)
    (iv,) = ratio_intervals(w, counts * 0.3, counts)  # every cluster has mean 0.3: nothing to resample
    assert iv == pytest.approx([0.3, 0.3])
    sums = np.arange(1.0, 11.0) * 5
    (one,) = ratio_intervals(w, sums, counts, alpha_lo=0.0, alpha_hi=0.025)
    two = ratio_interval(w, sums, counts)
    assert one[0] == -np.inf and one[1] == pytest.approx(two[1])


def test_dominance_diagnostic_fires_on_one_dominant_cluster_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """One cluster holding more than half of the KLD total flags the level as not guaranteed, reads the upper end at
    the floor a / 100 (never narrower than without the diagnostic) and says so in the method text; 16 ordinary
    clusters (lognormal 0.6 cluster effects, a real-LLM-like spread) do not fire it and keep their interval."""
    import harness.metrics.bootstrap as bs

    C = 16
    counts = np.full(C, 255.0)
    ordinary = counts * 1e-3 * np.random.default_rng(7).lognormal(0.0, 0.6, C)
    dominant = ordinary.copy()
    dominant[3] = 1.5 * (ordinary.sum() - ordinary[3])  # 60 % of the total
    W = draw_cluster_weights(C, 2000, seed=1)
    sums = np.stack([ordinary, dominant], axis=1)
    ivs, reads = ratio_intervals_read(W, sums, counts, bounds=(0.0, math.inf))
    r0, r1 = reads
    assert r0 is not None and r1 is not None
    assert r1.top_share == pytest.approx(dominant.max() / dominant.sum(), rel=1e-12)
    assert r0.top_share == pytest.approx(ordinary.max() / ordinary.sum(), rel=1e-12) and r0.top_share < 0.5
    assert r1.dominated and not r0.dominated
    assert r1.upper == pytest.approx(0.025 / 100) and r1.upper_at_floor
    assert r0.upper > 0.025 / 100 and not r0.upper_at_floor and not r0.lower_at_floor
    assert method_text([r0]) == MEAN_METHOD_TEXT
    assert "LEVEL NOT GUARANTEED" in method_text([r1]) and "60 %" in method_text([r1])
    monkeypatch.setattr(bs, "DOMINANT_SHARE", 1.0)  # the diagnostic off: the same data, the level rule alone
    unwidened, plain = ratio_intervals_read(W, sums, counts, bounds=(0.0, math.inf))
    assert plain[1] is not None and not plain[1].dominated and plain[1].upper >= r1.upper
    assert ivs[1] is not None and unwidened[1] is not None and ivs[1][1] >= unwidened[1][1]
    assert ivs[0] == unwidened[0]  # the ordinary data set does not move
