"""A shard's summary kept across runs (harness/run/summary_cache.py): a rerun of unchanged positions and statistics
settings reads it; a changed setting (seed, replicates, level, statistics code) is summarized again, never read; a
forged entry is refused; ``score_cache = false`` (``--fidelity-no-score-cache``, ``fidelity ladder
--no-score-cache``) reads and keeps nothing. Summarizing is counted at the session's call of
:func:`harness.run.shard_summary.shard_metrics`; numbers are compared with a summary computed without any cache."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.capture.cache_sign import UntrustedCacheWarning, sign
from harness.cli.main import build_parser
from harness.inputs.config import load_config
from harness.metrics import bootstrap
from harness.run import session as session_module
from harness.run import summary_cache as summary_cache_module
from harness.run.score_cache import FOLDER as SCORES
from harness.run.session import FidelitySession
from harness.run.shard_summary import shard_metrics
from harness.run.summary_cache import FOLDER

N_BOOT = 200


@pytest.fixture()
def project(fresh_project: Path) -> Path:
    """The tiny project with no cache yet."""
    return fresh_project


@pytest.fixture()
def summarized(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The shards a session of this test summarizes (not reads)."""
    calls: list[int] = []
    real = session_module.shard_metrics

    def counting(pos: Any, **kw: Any) -> Any:
        calls.append(kw["score_from"])
        return real(pos, **kw)

    monkeypatch.setattr(session_module, "shard_metrics", counting)
    return calls


def _metrics(project: Path, *, seed: int | None = None, n_boot: int = N_BOOT, score_cache: bool = True,
             ) -> tuple[FidelitySession, dict[str, Any]]:
    config = load_config(project / "fidelity.toml")
    session = FidelitySession(dataclasses.replace(config, score_cache=score_cache))
    if seed is not None:
        session.bootstrap_seed = seed
    report = session.score(session.config.candidate("bad"), 0, n_boot=n_boot).report
    return session, dict(report.metrics)


def _entries(project: Path) -> list[Path]:
    return sorted((project / ".fidelity-cache" / FOLDER).glob("*.json"))


def _rewrite(entry: Path, key: bytes | None, edit: Any) -> None:
    """Change an entry's value by hand: re-signed with ``key`` (None: the old signature kept)."""
    doc = json.loads(entry.read_text())
    edit(doc["value"])
    entry.write_text(json.dumps(sign(doc, key) if key is not None else doc))


def test_unchanged_rerun_reads_the_summary_and_matches_an_uncached_one(project: Path, summarized: list[int]) -> None:
    s1, first = _metrics(project)
    assert summarized == [0] and len(_entries(project)) == 1 and s1.reuse.served("summary", "bad") == set()
    s2, second = _metrics(project)
    assert summarized == [0], "an unchanged summary was computed again"
    assert s2.reuse.served("summary", "bad") == {0} and second == first
    assert "summary cache: reused 1 of 1 shards (bad 1 of 1)" in s2.reuse.lines()
    # the same block as one summarized from the positions with no cache at all (JSON: what a report holds)
    fresh = shard_metrics(s2.positions(s2.config.candidate("bad"), 0), score_from=0, n_boot=N_BOOT)
    assert json.loads(json.dumps(fresh)) == second


@pytest.mark.parametrize("setting", ["seed", "n_boot", "level", "code"])
def test_a_changed_statistics_setting_is_summarized_again_never_read(
        project: Path, summarized: list[int], monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    s1, _ = _metrics(project)
    (entry,) = _entries(project)
    # the kept entry now says something no computation gives, signed as this harness's own: read when the key matches
    _rewrite(entry, s1.signing_key(), lambda v: v["kld"].update(mean=123.0))
    _, planted = _metrics(project)
    assert planted["kld"]["mean"] == 123.0 and summarized == [0]  # the test can fail: an unchanged key reads it
    kw: dict[str, Any] = {}
    if setting == "seed":
        kw["seed"] = bootstrap.DEFAULT_SEED + 1
    elif setting == "n_boot":
        kw["n_boot"] = N_BOOT + 100
    elif setting == "level":
        monkeypatch.setattr(bootstrap, "LEVEL", 0.9)
    else:  # an edited statistic (the statistics code's sha256)
        monkeypatch.setattr(summary_cache_module, "statistics_code_sha256", lambda: "0" * 64)
    s3, got = _metrics(project, **kw)
    assert summarized == [0, 0] and not s3.reuse.served("summary", "bad")
    assert got["kld"]["mean"] != 123.0 and len(_entries(project)) == 2


def test_a_candidate_scored_while_captured_reads_its_summary_and_a_changed_setting_recomputes(
        project: Path, summarized: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """``keep = "scores"``: the summary is keyed by what the live positions are keyed by (the capture, not a store)."""
    toml = project / "fidelity.toml"
    toml.write_text(toml.read_text().replace('name = "bad"\n', 'name = "bad"\nkeep = "scores"\n', 1))
    assert load_config(toml).candidate("bad").keep == "scores"
    s1, first = _metrics(project)
    (entry,) = _entries(project)
    assert summarized == [0] and json.loads(entry.read_text())["binding"]["positions"]["keep"] == "scores"
    _rewrite(entry, s1.signing_key(), lambda v: v["kld"].update(mean=123.0))
    s2, planted = _metrics(project)
    assert s2.reuse.served("scores", "bad") == {0}, "the live positions were not read from the scores cache"
    assert planted["kld"]["mean"] == 123.0 and summarized == [0]  # read, not summarized: the test can fail
    assert s2.reuse.served("summary", "bad") == {0}
    s3, got = _metrics(project, n_boot=N_BOOT + 100)
    assert summarized == [0, 0] and not s3.reuse.served("summary", "bad") and len(_entries(project)) == 2
    fresh = shard_metrics(s3.positions(s3.config.candidate("bad"), 0), score_from=0, n_boot=N_BOOT + 100)
    assert json.loads(json.dumps(fresh)) == got and first["kld"]["mean"] != 123.0


def test_a_forged_summary_is_refused_and_replaced(project: Path, summarized: list[int]) -> None:
    s1, true = _metrics(project)
    (entry,) = _entries(project)
    for key in (None, b"k" * 32):  # edited under the old signature; re-signed with another user's key
        _rewrite(entry, key, lambda v: v["kld"].update(mean=0.0))
        with pytest.warns(UntrustedCacheWarning, match=entry.name):
            s, got = _metrics(project)
        assert not s.reuse.served("summary", "bad") and got == true
    # this user's key over another setting's binding, renamed to this setting's file: its binding is checked
    doc = json.loads(entry.read_text())
    doc["binding"]["statistics"]["n_boot"] = N_BOOT + 1
    entry.write_text(json.dumps(sign(doc, s1.signing_key())))
    with pytest.warns(UntrustedCacheWarning, match="computed from"):
        _, got = _metrics(project)
    assert got == true and summarized == [0, 0, 0, 0]
    _, again = _metrics(project)  # the replaced entry is this harness's own now
    assert summarized == [0, 0, 0, 0] and again == true


def test_score_cache_off_reads_and_keeps_nothing(project: Path, summarized: list[int]) -> None:
    _, cached = _metrics(project)
    s, off = _metrics(project, score_cache=False)
    s2, off2 = _metrics(project, score_cache=False)
    assert summarized == [0, 0, 0] and off == cached == off2
    assert not s.reuse.served("scores", "bad") and not s2.reuse.served("summary", "bad")
    assert "score" not in " ".join(s2.reuse.lines()) and len(_entries(project)) == 1
    (project / "fidelity.toml").write_text((project / "fidelity.toml").read_text().replace(
        "[settings]", "[settings]\nscore_cache = false", 1))
    assert load_config(project / "fidelity.toml").score_cache is False
    shutil.rmtree(project / ".fidelity-cache")
    session = FidelitySession(load_config(project / "fidelity.toml"))
    session.score(session.config.candidate("bad"), 0, n_boot=N_BOOT)
    assert not (project / ".fidelity-cache" / FOLDER).exists() and not (project / ".fidelity-cache" / SCORES).exists()


def test_score_cache_setting_must_be_a_boolean(project: Path) -> None:
    from harness.inputs.config import ConfigError

    toml = project / "fidelity.toml"
    toml.write_text(toml.read_text().replace("[settings]", '[settings]\nscore_cache = "no"', 1))
    with pytest.raises(ConfigError, match=r"settings\.score_cache must be true or false, found 'no'"):
        load_config(toml)


def test_cli_ladder_takes_no_score_cache() -> None:
    args = build_parser().parse_args(["ladder", "fidelity.toml", "--no-score-cache"])
    assert args.no_score_cache is True
    assert build_parser().parse_args(["ladder", "fidelity.toml"]).no_score_cache is False


def test_pytest_no_score_cache_option(project: Path) -> None:
    """Through pytest: with --fidelity-no-score-cache the header says the cache is off, nothing is read or kept."""
    _metrics(project)  # one kept entry of each cache, which the run must not read
    kept = sorted(p.name for p in (project / ".fidelity-cache").rglob("*") if p.parent.name in (FOLDER, SCORES))
    out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "-p", "no:cacheprovider", "-m", "fidelity",
                          "-k", "bad and shard", "--fidelity-update-baselines", "--fidelity-shards", "0",
                          "--fidelity-no-floor", "--fidelity-no-score-cache"],
                         cwd=project, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "fidelity: scores cache off (--fidelity-no-score-cache" in out.stdout
    assert "score cache:" not in out.stdout and "summary cache:" not in out.stdout
    assert sorted(p.name for p in (project / ".fidelity-cache").rglob("*") if p.parent.name in (FOLDER, SCORES)) == kept


def test_xdist_workers_read_and_keep_summaries(project: Path) -> None:
    """Through pytest-xdist (``-n 2``, one shard case a worker): the worker of a shard summarized before reads its
    kept summary (a planted, signed value shows in its report), the other's summary is computed and kept, and the
    controller says what was reused."""
    s1, _ = _metrics(project, n_boot=load_config(project / "fidelity.toml").n_boot)  # shard 0, as the run keys it
    (entry,) = _entries(project)
    _rewrite(entry, s1.signing_key(), lambda v: v["kld"].update(mean_context_macro=123.0))
    out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "-p", "no:cacheprovider", "-m", "fidelity",
                          "-n", "2", "-k", "bad and shard", "--fidelity-shards", "0,1", "--fidelity-no-floor",
                          "--fidelity-report-dir", "reports"], cwd=project, capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "created: 2/2 workers" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    # (kld.mean is re-derived from the totals by the controller: the planted value is one that is not)
    means = {int(p.stem[-2:]): json.loads(p.read_text())["metrics"]["kld"]["mean_context_macro"]
             for p in (project / "reports" / "bad").glob("shard-*.json")}
    assert means[0] == 123.0 and 0 < means[1] < 1, means
    assert "summary cache: reused 1 of 2 shards (bad 1 of 2)" in out.stdout, out.stdout[-2000:]
    assert len(_entries(project)) == 2


def test_kept_results_are_read_by_content_and_refused_when_forged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """harness/io/kept.py over harness/run/kept_results.py: the same inputs and code read the kept result; a changed
    array element, code file or a forged entry is computed again."""
    # "no store" below: a pytest-xdist worker of a run that collects fidelity.toml's cases keeps results in the
    # repository's cache for its whole session (an earlier run's entry would be read, and written there)
    monkeypatch.setattr("harness.io.kept._stores", [])
    import numpy as np

    from harness.io.hashing import content_sha256
    from harness.io.kept import kept, kept_by, kept_key
    from harness.run.kept_results import FOLDER as RESULTS
    from harness.run.kept_results import PROTOCOL, results_store
    from harness.run.reuse import ReuseLog

    code = tmp_path / "code.py"
    code.write_text("# v1\n")
    calls: list[float] = []

    def compute(x: np.ndarray) -> dict[str, Any]:
        calls.append(float(x.sum()))
        return {"sum": float(x.sum())}

    x = np.arange(6, dtype=np.float64)
    y = x.copy()
    y[3] += 1e-12  # one element, one ulp-scale change
    assert content_sha256({"a": x}) != content_sha256({"a": y}) != content_sha256({"a": y.astype(np.float32)})
    assert kept("r", {"a": x}, [code], lambda: compute(x)) == {"sum": 15.0} and len(calls) == 1  # no store: computed
    log = ReuseLog()
    with kept_by(results_store(tmp_path / "cache", b"s" * 32, log)):
        assert kept("r", {"a": x}, [code], lambda: compute(x)) == {"sum": 15.0}
    log = ReuseLog()
    with kept_by(results_store(tmp_path / "cache", b"s" * 32, log)):
        assert kept("r", {"a": x}, [code], lambda: compute(x)) == {"sum": 15.0}
        assert len(calls) == 2 and "result cache: reused 1 of 1 results (r 1 of 1)" in log.lines()
        kept("r", {"a": y}, [code], lambda: compute(y))
        code.write_text("# v2\n")
        kept("r", {"a": x}, [code], lambda: compute(x))
        assert len(calls) == 4
        (entry,) = [p for p in (tmp_path / "cache" / RESULTS).glob("r-*.json")
                    if json.loads(p.read_text())["binding"] == {"protocol": PROTOCOL, **kept_key("r", {"a": x}, [code])}]
        doc = json.loads(entry.read_text())
        doc["value"]["sum"] = 0.0
        entry.write_text(json.dumps(doc))
        with pytest.warns(UntrustedCacheWarning, match=entry.name):
            assert kept("r", {"a": x}, [code], lambda: compute(x)) == {"sum": 15.0}
        assert len(calls) == 5
    assert kept("r", {"a": x}, [code], lambda: compute(x)) == {"sum": 15.0} and len(calls) == 6  # store closed
