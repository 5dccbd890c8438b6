"""Tails, window and paired cases and the adaptive ladder, through pytester on the tiny project."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # full tiny-project runs through pytester (captures, every report case, xdist)


@pytest.fixture
def project(pytester: pytest.Pytester, fidelity_project: Path) -> pytest.Pytester:
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)  # the plugin collects every case from fidelity.toml
    return pytester


def _load(p: Path) -> dict[str, Any]:
    return json.loads(p.read_text())


def test_collection_ids_and_markers(project: pytest.Pytester) -> None:
    r = project.runpytest("--collect-only", "-q", "-m", "fidelity_tails or fidelity_window or fidelity_paired")
    r.stdout.fnmatch_lines([
        "*test_tails[[]tails-good[]]*",
        "*test_tails[[]tails-bad[]]*",
        "*test_window[[]window-from0[]]*",
        "*test_window[[]window-from16[]]*",
        "*test_window[[]window-from64[]]*",
        "*fidelity.toml::test_paired[[]pair-good-vs-bad[]]*",
        "*6/14 tests collected*",
    ])


def _margin(p: pytest.Pytester, text: str, old: str = "margin = 0.001") -> None:
    toml = p.path / "fidelity.toml"
    toml.write_text(toml.read_text().replace(old, text))


def test_report_cases_write_their_artifacts(project: pytest.Pytester) -> None:
    """One run: every fidelity case plus tails, windows and the pair; scoring happens once per shard."""
    _margin(project, "margin = 0.00001")  # bad's drift (~6e-4) is far outside this margin
    result = project.runpytest("--fidelity-update-baselines", "--fidelity-report-dir", "out")
    result.assert_outcomes(passed=13, skipped=1)  # window-from64 > n_ctx - 2 = 30: skipped with a note
    result.stdout.fnmatch_lines(["*fidelity reports*", "*window: ranking stable*", "*paired good vs bad: good better*"])
    out = project.path / "out"
    tails = _load(out / "tails.json")
    assert [c["candidate"] for c in tails["candidates"]] == ["bad", "good"]
    for c in tails["candidates"]:
        cum = c["cumulative"]
        assert cum["n_positions"] == 8 * 31 and len(c["shards"]) == 4
        # against the shard reports the fidelity cases wrote (summarize's counts, another code path)
        written = [_load(out / c["candidate"] / f"shard-{k:02d}.json")["metrics"]["exceedance"] for k in range(4)]
        assert cum["exceedance"] == {t: sum(w[t] for w in written) for t in cum["exceedance"]}
        assert all(lo <= cum["exceedance"][t] <= hi for t, (lo, hi) in cum["exceedance_histogram_bounds"].items())
        assert c["problems"] == []
    assert (out / "tails.png").stat().st_size > 10_000
    assert "| **all** |" in (out / "tails.md").read_text()
    win = _load(out / "window.json")
    assert set(win["windows"]) == {"0", "16"}
    assert win["windows"]["16"]["candidates"]["good"]["n_positions"] == 8 * (31 - 16)
    assert win["ranking_base"] == ["good", "bad"] and win["windows"]["16"]["ranking"] == ["good", "bad"]
    assert "score_from=64 skipped" in (out / "window.md").read_text()
    pair = _load(out / "paired" / "good-vs-bad.json")
    assert pair["verdict"] == "A better" and pair["kld_mean"]["ci95"][1] < 0
    assert pair["n_positions"] == 8 * 31
    assert "Verdict: good better" in (out / "paired" / "good-vs-bad.md").read_text()
    # the shard reports of the same run agree with the tails' exact per-shard numbers
    shard0 = _load(out / "good" / "shard-00.json")
    t0 = next(c for c in tails["candidates"] if c["candidate"] == "good")["shards"][0]
    assert t0["exceedance"] == shard0["metrics"]["exceedance"]
    assert t0["percentiles"]["p99"] == pytest.approx(shard0["metrics"]["kld"]["p99"], rel=1e-12)


def test_pair_expectation_fails_with_a_readable_message(project: pytest.Pytester) -> None:
    _margin(project, 'margin = 0.002\nexpect = "equivalent"')  # 6e-4 apart: inside the generous margin
    project.runpytest("-m", "fidelity_paired").assert_outcomes(passed=1)
    _margin(project, "margin = 0.00001", old="margin = 0.002")  # expect stays
    result = project.runpytest("-m", "fidelity_paired")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*pair good-vs-bad: verdict 'A better', expected 'equivalent' (mean KLD difference "
                                 "*margin ±1e-05; smallest certifiable margin ±*)*"])


def _window_summary(sums: list[float], positions: float = 100.0) -> dict[str, Any]:
    """A window summary of 10 clusters (the fields compare_windows reads)."""
    n = len(sums)
    return {"mean_kld": sum(sums) / (n * positions), "ci95": None, "n_positions": int(n * positions),
            "clusters": {"names": [f"c{i}" for i in range(n)], "sum_kld": list(sums), "positions": [positions] * n,
                         "n_boot": 2000, "seed": 1}}


def test_window_flip_judged_by_the_paired_difference() -> None:
    """Overlapping per-candidate intervals but a consistent paired difference: a real flip fails;
    a flip whose paired difference straddles 0 at one window only warns."""
    from harness.reports.windows import compare_windows, flip_message, paired_difference

    rng = np.random.default_rng(5)
    difficulty = rng.lognormal(0, 0.8, 10) * 100  # shared: wide per-candidate intervals
    noise = rng.normal(0, 0.5, 10)
    base = {"a": _window_summary(list(difficulty)), "b": _window_summary(list(difficulty + 3 + noise)),
            "c": _window_summary(list(difficulty + 3 + rng.normal(0, 20, 10)))}
    at16 = {"a": _window_summary(list(difficulty + 6)), "b": _window_summary(list(difficulty + 3 + noise)),
            "c": _window_summary(list(difficulty + 3 + rng.normal(0, 20, 10)))}
    lo, hi = paired_difference(base["a"], base["b"])
    assert hi < 0  # a below b beyond noise at the base window
    cmp = compare_windows(0, {0: base, 16: at16})
    w = cmp["windows"]["16"]
    assert ["a", "b"] in w["flips"]["failures"]
    assert all(p not in w["flips"]["failures"] for p in (["a", "c"], ["b", "c"], ["c", "a"], ["c", "b"]))
    assert "CHANGES" in cmp["verdict"]
    assert w["candidates"]["a"]["rel_change_mean_kld"] == pytest.approx(6 / difficulty.mean())
    assert "a < b at score_from=0 but b < a at score_from=16" in flip_message(16, 0, w["flips"]["failures"])


def test_window_paired_difference_matches_an_explicit_bootstrap() -> None:
    """The flip judge's interval equals ratio_interval over the explicit per-cluster differences."""
    from harness.metrics.bootstrap import draw_cluster_weights, ratio_interval
    from harness.reports.windows import paired_difference

    a, b = [float(x) for x in range(1, 11)], [float(x) ** 1.1 for x in range(1, 11)]
    W = draw_cluster_weights(10, 2000, 1)
    diff = np.array(a) - np.array(b)
    assert paired_difference(_window_summary(a), _window_summary(b)) == ratio_interval(W, diff, np.full(10, 100.0))


def test_paired_verdict_rule() -> None:
    from harness.reports.paired import verdict

    assert verdict([-0.0005, 0.0004], 0.001) == "equivalent"
    assert verdict([-0.0005, -0.0001], 0.001) == "equivalent"  # inside the margin wins
    assert verdict([-0.01, -0.002], 0.001) == "A better"
    assert verdict([0.002, 0.01], 0.001) == "B better"
    assert verdict([-0.01, 0.01], 0.001) == "inconclusive"


def test_adaptive_never_stops_below_the_minimum_clusters_and_states_the_rule(project: pytest.Pytester) -> None:
    project.runpytest("--fidelity-update-baselines", "-k", "good or bad", "-m", "fidelity")
    # a generous default threshold: good is far below it, so it stops after the first look
    for name, limit in (("good", 10.0), ("bad", 1e-9)):
        path = project.path / "baselines" / f"{name}.json"
        doc = _load(path)
        doc["default"] = {"max_mean_kld": limit}
        doc["shards"] = {}
        path.write_text(json.dumps(doc))
    result = project.runpytest("--fidelity-adaptive", "--fidelity-report-dir", "ad", "-rs", "-m", "fidelity")
    # the tiny suite has 8 source clusters, fewer than an early stop needs (40): every shard is scored,
    # good passes its 4 shards, bad fails its 4 (1e-9), and the records say why nothing stopped
    result.assert_outcomes(passed=4, failed=4)
    doc = _load(project.path / "ad" / "adaptive.json")
    assert "Bonferroni" in doc["rule"] and doc["min_early_clusters"] == 40 and doc["alpha_side"] == 0.025
    assert len(doc["looks"]) == 8 and all(r["side"] is None and r["alpha_k"] is None and r["ci"] is None for r in doc["looks"])
    assert [r["clusters"] for r in doc["looks"] if r["candidate"] == "good"] == sorted(r["clusters"] for r in doc["looks"] if r["candidate"] == "good")
    assert "may not stop at this look" in (project.path / "ad" / "adaptive.md").read_text()


def test_adaptive_with_xdist_needs_loadgroup(project: pytest.Pytester) -> None:
    r = project.runpytest("--fidelity-adaptive", "-n", "2")
    assert r.ret != 0
    r.stderr.fnmatch_lines(["*--fidelity-adaptive with -n needs --dist loadgroup*"])


def test_xdist_writes_what_a_serial_run_writes(project: pytest.Pytester) -> None:
    """Workers report, the controller writes: tails, window and paired artifacts equal a serial run's."""
    project.runpytest("--fidelity-update-baselines", "-m", "fidelity")  # baselines first: tails read max_p99
    project.runpytest("--fidelity-report-dir", "serial").assert_outcomes(passed=13, skipped=1)
    par = project.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "--fidelity-report-dir", "par")
    par.assert_outcomes(passed=13, skipped=1)
    for rel in ("tails.json", "window.json", "paired/good-vs-bad.json"):
        assert _load(project.path / "serial" / rel) == _load(project.path / "par" / rel), rel
    # the workers handed scored positions over through a folder of the session, gone with it
    handed_over = list(project.path.rglob("scored/*"))
    assert handed_over == [], handed_over
    assert all(c["max_p99_baseline"] for c in _load(project.path / "par" / "tails.json")["candidates"])


def test_detectable_reversal_matches_a_normal_power_calculation() -> None:
    """The smallest reversal with 80 % power, from the report's draws, against an independent normal-theory
    computation (scipy): with many clusters and independent windows the replicate differences are normal with
    the cluster-robust standard error, so power(rho) = Phi((rho m0 - h0) / se0) * Phi((rho mk - hk) / sek)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    from harness.metrics.bootstrap import draw_cluster_weights, ratio_interval
    from harness.reports.windows import detectable_reversal

    C, n = 400, 100.0
    rng = np.random.default_rng(11)

    def summary(sums: np.ndarray) -> dict[str, Any]:
        s = _window_summary(list(sums), positions=n)
        s["clusters"]["n_boot"] = 10000
        return s

    base_b, k_b = rng.normal(1.0, 0.3, C) * n, rng.normal(1.0, 0.3, C) * n
    base_a, k_a = base_b + rng.normal(0.0, 0.2, C) * n, k_b + rng.normal(0.0, 0.2, C) * n
    sa0, sb0, sak, sbk = summary(base_a), summary(base_b), summary(k_a), summary(k_b)
    got = detectable_reversal(sa0, sb0, sak, sbk)

    def side(sa: dict[str, Any], sb: dict[str, Any]) -> tuple[float, float, float, float]:
        d = np.asarray(sa["clusters"]["sum_kld"]) - np.asarray(sb["clusters"]["sum_kld"])
        counts = np.full(C, n)
        est = d.sum() / counts.sum()
        e = d - est * counts
        se = float(np.sqrt(C / (C - 1) * (e**2).sum()) / counts.sum())
        lo, hi = ratio_interval(draw_cluster_weights(C, 10000, 1), d, counts)  # type: ignore[misc]
        return se, est - lo, hi - est, 0.5 * (sa["mean_kld"] + sb["mean_kld"])

    se0, lo0, hi0, m0 = side(sa0, sb0)
    sek, lok, hik, mk = side(sak, sbk)

    def power(rho: float) -> float:
        up = norm.cdf((rho * m0 - lo0) / se0) * norm.cdf((rho * mk - hik) / sek)
        down = norm.cdf((rho * m0 - hi0) / se0) * norm.cdf((rho * mk - lok) / sek)
        return float(min(up, down))

    expected = brentq(lambda r: power(r) - 0.8, 1e-6, 10.0)
    print(f"smallest reversal: {got}, normal theory {expected}")
    assert got is not None and abs(got - expected) <= 0.05 * expected, (got, expected)


def test_a_failing_tails_case_is_one_readable_message(project: pytest.Pytester) -> None:
    """A tails case over its baseline's max_p99 fails with its message and the update command: no traceback,
    no repr of the case object."""
    project.runpytest("-m", "fidelity", "--fidelity-candidates", "good", "--fidelity-update-baselines").assert_outcomes(passed=4)
    path = project.path / "baselines" / "good.json"
    doc = _load(path)
    for entry in doc["shards"].values():
        entry["max_p99"] = 1e-12
    path.write_text(json.dumps(doc))
    r = project.runpytest("-m", "fidelity_tails", "--fidelity-candidates", "good")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*good: p99 >= * > max 1e-12 (max_p99 of its baseline)*",
                            "*if this p99 change is intended, update the baseline with: "
                            "pytest fidelity.toml --fidelity-candidates good --fidelity-update-baselines*"])
    assert "TailCase(" not in r.stdout.str() and "Traceback" not in r.stdout.str()
