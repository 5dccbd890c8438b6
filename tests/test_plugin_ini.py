"""The plugin's ini keys (harness/plugin/ini.py) and the session header's thread line, through pytester."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.plugin.pytest_plugin import CONFIG_KEY, OPTION_KEYS


@pytest.fixture
def project(pytester: pytest.Pytester, fidelity_project: Path) -> pytest.Pytester:
    """The tiny project with its configuration renamed (so only an ini key or an option finds it)."""
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    (pytester.path / "fidelity.toml").rename(pytester.path / "my.toml")
    return pytester


def _ini(p: pytest.Pytester, **keys: str) -> None:
    lines = "\n".join(f"{k} = {v!r}" for k, v in keys.items()).replace("'", '"')
    (p.path / "pyproject.toml").write_text(f"[tool.pytest.ini_options]\n{lines}\n")


def test_pytest_help_lists_every_ini_key(pytester: pytest.Pytester) -> None:
    out = pytester.runpytest("--help").stdout.str()
    for key in (CONFIG_KEY, *OPTION_KEYS):
        assert f"{key.dest} " in out and key.flag in out
    assert {"fidelity_config", "fidelity_report_dir", "fidelity_candidates", "fidelity_shards"} <= {
        k.dest for k in (CONFIG_KEY, *OPTION_KEYS)}


def test_ini_keys_select_the_configuration_and_the_cases(project: pytest.Pytester) -> None:
    _ini(project, fidelity_config="my.toml", fidelity_candidates="good", fidelity_shards="1",
         fidelity_report_dir="ini-reports")
    r = project.runpytest("--collect-only", "-q")
    r.stdout.fnmatch_lines(["*my.toml::test_fidelity[[]good-shard01[]]*"])
    assert "bad-shard" not in r.stdout.str() and "good-shard00" not in r.stdout.str()
    # the command line wins over the ini file, key by key
    r = project.runpytest("--collect-only", "-q", "--fidelity-shards", "0,2")
    r.stdout.fnmatch_lines(["*test_fidelity[[]good-shard00[]]*", "*test_fidelity[[]good-shard02[]]*"])
    assert "good-shard01" not in r.stdout.str()
    header = project.runpytest("--collect-only").stdout.str()
    assert f"reports {project.path / 'ini-reports'}/" in header  # a path key: relative to the ini file
    assert "reports cli/" in project.runpytest("--collect-only", "--fidelity-report-dir", "cli").stdout.str()


def test_without_the_key_the_renamed_configuration_is_not_found(project: pytest.Pytester) -> None:
    r = project.runpytest("--collect-only", "-q")
    assert "test_fidelity" not in r.stdout.str()


def test_a_bad_ini_value_is_a_usage_error_naming_the_key(project: pytest.Pytester) -> None:
    _ini(project, fidelity_config="my.toml", fidelity_window="-3")
    r = project.runpytest("--collect-only", "-q")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*pyproject.toml: ini key fidelity_window = '-3': expected a row count >= 0, found -3*"])
    _ini(project, fidelity_config="missing.toml")
    r = project.runpytest("--collect-only", "-q")
    assert r.ret == pytest.ExitCode.USAGE_ERROR and "missing.toml" in r.stderr.str()


def test_the_header_says_the_threads_and_why(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    threads = torch.get_num_threads()  # the in-process session sets this process's torch threads
    _ini(project, fidelity_config="my.toml")
    monkeypatch.setenv("FIDELITY_THREADS", "1")
    try:
        project.runpytest("--collect-only").stdout.fnmatch_lines(
            ["fidelity: threads 1 of *: FIDELITY_THREADS=1 (override: FIDELITY_THREADS=N)"])
        monkeypatch.delenv("FIDELITY_THREADS")
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        project.runpytest("--collect-only").stdout.fnmatch_lines(
            ["fidelity: threads * of *: load average *.* (override: FIDELITY_THREADS=N)"])
    finally:
        torch.set_num_threads(threads)
