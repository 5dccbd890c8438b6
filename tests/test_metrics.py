"""Metrics: summary fields against numpy, histogram, tails, window, merging, paired."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.io.atomic import dumps_json
from harness.metrics import ContextLabel, LogHistogram, headline_from_totals, merge_totals, paired, summarize, totals
from harness.metrics.bootstrap import TAIL_MIN_CLUSTERS
from harness.metrics.histogram import EDGES, N_BINS, exceedance_counts
from harness.metrics.scores import PositionScores
from harness.metrics.tails import cvar, quantile, weighted_tail_stats


def make_scores(n: int, seed: int = 0, scale: float = 1.0) -> PositionScores:
    rng = np.random.default_rng(seed)
    return PositionScores(
        kld=rng.lognormal(-7, 2, n) * scale,
        jsd_bits=rng.random(n) * 0.01,
        ear=1 - rng.random(n) * 0.05,
        nll_ref=rng.random(n) * 5,
        nll_cand=rng.random(n) * 5,
        argmax_ref=rng.integers(0, 3, n),
        argmax_cand=rng.integers(0, 3, n),
        kld_rev=rng.lognormal(-7, 2, n) * scale,
        entropy_ref=rng.lognormal(0, 1.5, n),
        p_ref_top=rng.random(n),
        q_ref_top=rng.random(n),
        top5_overlap=rng.integers(0, 6, n),
        top10_overlap=rng.integers(0, 11, n),
    )


def make_suite(n_ctx: int, per: int, n_clusters: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ci = np.repeat(np.arange(100, 100 + n_ctx), per)
    row = np.tile(np.arange(per), n_ctx)
    labels = [ContextLabel(100 + i, f"doc{rng.integers(0, n_clusters)}", ["code", "prose", "chat"][i % 3]) for i in range(n_ctx)]
    return ci, row, labels


def test_summary_matches_numpy(reference_interval) -> None:
    s = make_scores(3000)
    ci, row, labels = make_suite(60, 50, 20)
    m = summarize(s, ci, row, labels, n_boot=300, n_boot_tails=100)
    k = s.kld
    assert m["n_positions"] == 3000 and m["n_contexts"] == 60 and m["n_clusters"] <= 20
    assert m["kld"]["mean"] == pytest.approx(k.mean(), rel=1e-12)
    for name, q in (("median", 0.5), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999)):
        assert m["kld"][name] == np.quantile(k, q, method="linear")
    assert m["kld"]["max"] == k.max()
    worst = np.sort(k)[::-1]
    assert m["kld"]["cvar1"] == pytest.approx(worst[:30].mean(), rel=1e-12)  # k = 30 exactly
    assert m["top1"]["agreement"] == pytest.approx(s.top1.mean())
    assert m["ear"]["mean"] == pytest.approx(s.ear.mean())
    assert m["jsd_bits"]["mean"] == pytest.approx(s.jsd_bits.mean())
    assert m["ppl"]["ref"] == pytest.approx(math.exp(s.nll_ref.mean()))
    assert m["ppl"]["mean_ln_ratio"] == pytest.approx((s.nll_cand - s.nll_ref).mean())
    dp = np.exp(-s.nll_cand) - np.exp(-s.nll_ref)
    assert m["delta_p"]["rms"] == pytest.approx(np.sqrt((dp**2).mean()))
    assert m["delta_p"]["percentiles"]["p50"] == pytest.approx(np.median(dp))
    assert m["exceedance"] == {f"{t:g}": int((k > t).sum()) for t in (1e-4, 1e-3, 1e-2, 1e-1, 1.0)}
    assert sum(m["histogram"]["counts"]) == 3000
    # the interval against an independent float64 implementation on the raw positions (same documented draw)
    from harness.metrics.bootstrap import DEFAULT_SEED, draw_cluster_weights

    names: dict[str, int] = {}
    for lab in labels:
        names.setdefault(lab.source_cluster, len(names))
    by_index = {lab.index: names[lab.source_cluster] for lab in labels}
    cluster = [by_index[int(i)] for i in ci]
    W = draw_cluster_weights(len(names), 300, DEFAULT_SEED)
    want = reference_interval(k, cluster, W, right_skewed=True)  # the KLD: a right-skewed mean
    assert m["kld"]["ci95"] == pytest.approx(want, rel=1e-9)
    assert m["bootstrap"]["method"] == "studentized" and m["bootstrap"]["estimable"] is True
    dumps_json(m)  # JSON-ready, no NaN


def test_too_few_clusters_is_not_estimable() -> None:
    """Fewer source clusters than MIN_CLUSTERS: every interval is null, never zero-width."""
    from harness.metrics.bootstrap import MIN_CLUSTERS
    from harness.reports.shard import ShardReport, render_markdown

    s = make_scores(400, seed=4)
    ci, row, labels = make_suite(8, 50, 1, seed=4)  # one source cluster (a suite built from one file)
    m = summarize(s, ci, row, labels, n_boot=100, n_boot_tails=50)
    assert m["n_clusters"] == 1 < MIN_CLUSTERS and m["bootstrap"]["estimable"] is False
    assert m["kld"]["ci95"] is None and m["top1"]["ci95"] is None and m["kld"]["p99_ci95"] is None
    rep = ShardReport("x", {"shard": {"index": 0, "sha256": "0"}}, m)
    text = render_markdown(rep)
    assert "not estimable" in text and "Not estimable: 1 source clusters" in text


def test_tail_intervals_only_from_the_clusters_they_need() -> None:
    """Below TAIL_MIN_CLUSTERS the p99 / CVaR1% intervals are null and the report says why; from it on they are
    the percentile intervals (0.25 % per side) of the tail statistics of the expanded resampled positions (checked one replicate
    at a time with numpy on np.repeat-expanded samples, independent of the weighted-tail code)."""
    from harness.metrics.bootstrap import DEFAULT_SEED, MIN_CLUSTERS, draw_cluster_weights
    from harness.metrics.tails import cvar
    from harness.reports.shard import ShardReport, render_markdown

    few = MIN_CLUSTERS + 1
    s = make_scores(few * 20, seed=6)
    ci = np.repeat(np.arange(few), 20)
    labels = [ContextLabel(i, f"doc{i}", "prose") for i in range(few)]
    m = summarize(s, ci, np.tile(np.arange(20), few), labels, n_boot=200, n_boot_tails=50)
    assert m["kld"]["ci95"] is not None and m["kld"]["p99_ci95"] is None and m["kld"]["cvar1_ci95"] is None
    assert m["bootstrap"]["tail_estimable"] is False and m["bootstrap"]["tail_min_clusters"] == TAIL_MIN_CLUSTERS
    lv = m["bootstrap"]["levels"]
    assert set(lv) == {"kld", "top1", "ear", "jsd_bits", "kld_rev", "top5_shared", "top10_shared"}
    assert 0 < lv["kld"]["upper"] <= 0.025 and lv["kld"]["lower"] >= 0.025  # each side's level, as read
    assert m["bootstrap"]["level_guaranteed"] is (not lv["kld"]["dominated"])
    text = render_markdown(ShardReport("x", {"shard": {"index": 0, "sha256": "0"}}, m))
    assert f"p99 and CVaR1% intervals not estimable: {few} source clusters, fewer than the {TAIL_MIN_CLUSTERS}" in text

    C, per, nt = TAIL_MIN_CLUSTERS, 5, 40
    s = make_scores(C * per, seed=7)
    ci = np.repeat(np.arange(C), per)
    labels = [ContextLabel(i, f"doc{i}", "prose") for i in range(C)]
    m = summarize(s, ci, np.tile(np.arange(per), C), labels, n_boot=100, n_boot_tails=nt)
    W = draw_cluster_weights(C, 100, DEFAULT_SEED)[:nt]
    q99 = [np.quantile(np.repeat(s.kld, W[b][ci]), 0.99) for b in range(nt)]
    cv = [cvar(np.repeat(s.kld, W[b][ci]), 0.01) for b in range(nt)]
    assert m["kld"]["p99_ci95"] == pytest.approx(list(np.quantile(q99, [0.0025, 0.9975])), rel=1e-12)
    assert m["kld"]["cvar1_ci95"] == pytest.approx(list(np.quantile(cv, [0.0025, 0.9975])), rel=1e-12)


def test_headline_recomputable_from_context_rows() -> None:
    s = make_scores(1200, seed=1)
    ci, row, labels = make_suite(40, 30, 9, seed=1)
    m = summarize(s, ci, row, labels, n_boot=100, n_boot_tails=50)
    rows = m["contexts"]
    assert len(rows) == 40
    assert sum(r["positions"] for r in rows) == m["n_positions"]
    assert math.fsum(r["sum_kld"] for r in rows) / m["n_positions"] == pytest.approx(m["kld"]["mean"], rel=1e-12)
    assert sum(r["top1"] for r in rows) == m["top1"]["count"]
    assert np.mean([r["mean_kld"] for r in rows]) == pytest.approx(m["kld"]["mean_context_macro"])
    assert [r["mean_kld"] for r in m["worst_contexts"]] == sorted((r["mean_kld"] for r in rows), reverse=True)[:20]
    strata = m["per_stratum"]
    assert set(strata) == {"code", "prose", "chat"}
    assert sum(v["positions"] for v in strata.values()) == 1200


def test_window_drops_rows_before_any_statistic() -> None:
    s = make_scores(400, seed=2)
    ci, row, labels = make_suite(8, 50, 4, seed=2)
    m = summarize(s, ci, row, labels, score_from=25, n_boot=100, n_boot_tails=50)
    kept = s.kld[row >= 25]
    assert m["n_positions"] == 200 and m["score_from"] == 25
    assert m["kld"]["mean"] == pytest.approx(kept.mean())
    assert m["kld"]["max"] == kept.max()
    assert m["kld"]["p99"] == np.quantile(kept, 0.99)
    with pytest.raises(ValueError, match="without positions"):
        summarize(s, ci, row, labels, score_from=50, n_boot=10)


def test_unknown_context_is_rejected() -> None:
    s = make_scores(20)
    ci, row, labels = make_suite(2, 10, 1)
    with pytest.raises(ValueError, match="not in the label list"):
        summarize(s, ci, row, labels[:1], n_boot=10)


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    s = make_scores(500, seed=3)
    ci, row, labels = make_suite(25, 20, 10, seed=3)
    a = summarize(s, ci, row, labels, n_boot=200, n_boot_tails=50, seed=7)
    b = summarize(s, ci, row, labels, n_boot=200, n_boot_tails=50, seed=7)
    c = summarize(s, ci, row, labels, n_boot=200, n_boot_tails=50, seed=8)
    assert a["kld"]["ci95"] == b["kld"]["ci95"] != c["kld"]["ci95"]


# ---- histogram --------------------------------------------------------------------------------


def test_histogram_bins_and_overflow() -> None:
    vals = np.array([-1e-15, 0.0, 5e-13, 1e-12, 1e-4, 99.99, 100.0, 1e6])
    h = LogHistogram.from_values(vals)
    assert h.total == 8
    assert h.counts[0] == 3  # negative, zero, < 1e-12
    assert h.counts[1] == 1  # [1e-12, edge1)
    assert h.counts[-1] == 2  # >= 100
    assert h.counts[N_BINS] == 1  # last interior bin holds 99.99
    k = int(np.searchsorted(EDGES, 1e-4))
    assert h.counts[1 + k] == 1 and EDGES[k] == 1e-4
    assert len(h.to_json()["counts"]) == N_BINS + 2
    assert LogHistogram.from_json(h.to_json()).counts.tolist() == h.counts.tolist()


def test_histogram_quantile_bounds_bracket_numpy() -> None:
    x = np.random.default_rng(4).lognormal(-8, 3, 5001)
    h = LogHistogram.from_values(x)
    for q in (0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0):
        lo, hi = h.quantile_bounds(q)
        assert lo <= np.quantile(x, q) <= hi


kld_lists = st.lists(
    st.one_of(st.floats(0, 200, allow_nan=False), st.just(0.0), st.floats(-1e-12, 1e-11)), min_size=2, max_size=300
)


@settings(max_examples=60, deadline=None)
@given(kld_lists, st.data())
def test_property_halves_combine_to_whole(values: list[float], data: st.DataObject) -> None:
    n = len(values)
    cut = data.draw(st.integers(1, n - 1))
    rng = np.random.default_rng(n)
    s = PositionScores(
        np.array(values), rng.random(n), rng.random(n), rng.random(n), rng.random(n), rng.integers(0, 2, n), rng.integers(0, 2, n),
        rng.random(n), rng.random(n) * 5, rng.random(n), rng.random(n), rng.integers(0, 6, n), rng.integers(0, 11, n),
    )
    whole = totals(s)
    merged = merge_totals([totals(s.select(slice(0, cut))), totals(s.select(slice(cut, n)))])
    assert sum(whole["histogram"]["counts"]) == n
    assert merged["histogram"] == whole["histogram"]
    assert merged["exceedance"] == whole["exceedance"]
    assert merged["max_kld"] == whole["max_kld"]
    assert merged["n_positions"] == n and merged["top1_count"] == whole["top1_count"]
    for k in ("sum_kld", "sum_ear", "sum_nll_ref", "sum_delta_p"):
        assert merged[k] == pytest.approx(whole[k], rel=1e-12, abs=1e-12)
    assert headline_from_totals(merged)["kld_mean"] == pytest.approx(float(np.mean(values)), rel=1e-12, abs=1e-15)


# ---- tails ------------------------------------------------------------------------------------


def _cvar_bruteforce(x: np.ndarray, alpha: float) -> float:
    d = np.sort(x)[::-1]
    k = alpha * len(x)
    if k <= 1:
        return float(d[0])
    f = math.floor(k)
    s = d[:f].sum() + ((k - f) * d[f] if f < len(d) else 0.0)
    return float(s / k)


@pytest.mark.parametrize("n", [1, 7, 100, 150, 1234])
def test_cvar_fractional_boundary(n: int) -> None:
    x = np.random.default_rng(n).lognormal(0, 2, n)
    assert cvar(x, 0.01) == pytest.approx(_cvar_bruteforce(x, 0.01), rel=1e-12)
    assert cvar(x, 0.3) == pytest.approx(_cvar_bruteforce(x, 0.3), rel=1e-12)


def test_weighted_tails_equal_expanded_sample() -> None:
    rng = np.random.default_rng(6)
    x = np.sort(rng.lognormal(-5, 2, 400))[::-1]
    w = rng.integers(0, 4, size=(20, 400))
    tot = w.sum(1).astype(float)
    q, c, ok = weighted_tail_stats(x, w, tot, 0.99, 0.01)
    assert ok.all()
    for b in range(20):
        e = np.repeat(x, w[b])
        assert q[b] == pytest.approx(quantile(e, 0.99), rel=1e-12)
        assert c[b] == pytest.approx(_cvar_bruteforce(e, 0.01), rel=1e-12)


# ---- paired -----------------------------------------------------------------------------------


def test_paired_tail_differences_follow_the_tail_rule() -> None:
    """From TAIL_MIN_CLUSTERS clusters the p99 / CVaR1 differences get an interval read at TAIL_ALPHA per side.

    Scaling b = 1.1 a makes every replicate's difference exactly -0.1 times a's own replicate, so the paired
    interval must be -0.1 times the reversed single-candidate interval of ``summarize`` (same seed, same draws)."""
    n_ctx = TAIL_MIN_CLUSTERS + 10
    s = make_scores(n_ctx * 4, seed=11)
    ci = np.repeat(np.arange(100, 100 + n_ctx), 4)
    row = np.tile(np.arange(4), n_ctx)
    labels = [ContextLabel(100 + i, f"doc{i}", "prose") for i in range(n_ctx)]
    worse = PositionScores(**{**s.to_dict(), "kld": s.kld * 1.1})
    p = paired(s, worse, ci, row, labels, n_boot=400, n_boot_tails=400)
    m = summarize(s, ci, row, labels, n_boot=400, n_boot_tails=400)
    assert p["bootstrap"]["tail_estimable"] is True and m["bootstrap"]["tail_estimable"] is True
    for pk, mk in (("kld_p99", "p99_ci95"), ("kld_cvar1", "cvar1_ci95")):
        lo, hi = m["kld"][mk]
        assert p[pk]["ci95"] == pytest.approx([-0.1 * hi, -0.1 * lo], rel=1e-9)
    same = paired(s, s, ci, row, labels, n_boot=400, n_boot_tails=400)
    assert same["kld_p99"]["ci95"] == [0.0, 0.0] and same["kld_cvar1"]["ci95"] == [0.0, 0.0]


def test_paired_identical_is_zero_and_common_random_numbers() -> None:
    s = make_scores(2000, seed=8)
    ci, row, labels = make_suite(40, 50, 12, seed=8)
    p = paired(s, s, ci, row, labels, n_boot=200, n_boot_tails=50)
    assert p["kld_mean"]["diff"] == 0.0 and p["kld_mean"]["ci95"] == [0.0, 0.0]
    # 12 source clusters: below TAIL_MIN_CLUSTERS the tail differences get no interval, like a shard's tails
    assert p["kld_p99"]["ci95"] is None and p["kld_cvar1"]["ci95"] is None
    assert p["bootstrap"]["tail_estimable"] is False
    assert p["contexts"] == {"a_wins": 0, "b_wins": 0, "ties": 40}
    worse = PositionScores(**{**s.to_dict(), "kld": s.kld * 1.1})
    p2 = paired(s, worse, ci, row, labels, n_boot=200, n_boot_tails=50)
    assert p2["contexts"]["a_wins"] == 40
    lo, hi = p2["kld_mean"]["ci95"]
    assert hi < 0  # a is better, and common random numbers make the interval tight
    assert not p2["kld_mean"]["interval_contains_zero"]
    m = summarize(s, ci, row, labels, n_boot=200, n_boot_tails=50)
    width_marginal = m["kld"]["ci95"][1] - m["kld"]["ci95"][0]
    assert (hi - lo) < 0.5 * width_marginal
    dumps_json(p2)


def test_paired_requires_same_positions() -> None:
    s = make_scores(100)
    ci, row, labels = make_suite(2, 50, 1)
    with pytest.raises(ValueError, match="same positions"):
        paired(s, s.select(slice(0, 99)), ci, row, labels, n_boot=10)


def test_exceedance_is_strict() -> None:
    assert exceedance_counts(np.array([1e-4, 1.0, 2.0])) == {"0.0001": 2, "0.001": 2, "0.01": 2, "0.1": 2, "1": 1}
