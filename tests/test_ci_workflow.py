"""CI pages: the GitHub Actions workflow in docs/ci/ (parsed, and its commands run here on the tiny project),
the job summary ($GITHUB_STEP_SUMMARY) and per-case numbers in junit XML without warnings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.plugin.step_summary import render

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "docs" / "ci" / "fidelity.yml"


def _workflow() -> dict[Any, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text("utf-8"))
    assert isinstance(doc, dict)
    return doc


def _steps() -> list[dict[str, Any]]:
    return list(_workflow()["jobs"]["ladder"]["steps"])


def _commands() -> list[str]:
    """The workflow's commands this machine runs: every ``run:`` line but the install."""
    lines = [line.strip() for s in _steps() if "run" in s for line in str(s["run"]).splitlines() if line.strip()]
    return [c for c in lines if not c.startswith("python -m pip ")]


def test_workflow_parses_and_has_the_ci_parts() -> None:
    doc = _workflow()
    assert doc["name"] == "fidelity" and set(doc[True]) == {"push", "pull_request"}  # YAML 1.1 reads "on" as True
    steps = _steps()
    uses = {str(s.get("uses", "")).split("@")[0]: s for s in steps}
    assert {"actions/checkout", "actions/setup-python", "actions/cache", "actions/upload-artifact"} <= set(uses)
    cache = uses["actions/cache"]["with"]
    assert cache["path"] == ".fidelity-cache" and "hashFiles(" in cache["key"] and cache["restore-keys"]
    upload = uses["actions/upload-artifact"]
    assert upload["if"] == "always()" and "fidelity-reports/" in upload["with"]["path"].split()
    ladder = next(c for c in _commands() if c.startswith("pytest "))
    assert " -n 2 " in ladder and "--dist loadgroup" in ladder and "--junitxml junit.xml" in ladder
    assert "-W error::pytest.PytestWarning" in ladder
    assert _commands() == [ladder, "fidelity publish --reports fidelity-reports --config fidelity.toml --out published",
                           "fidelity verify published"]


def _sh(cmd: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    bin_dir = str(Path(sys.executable).parent)
    full = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), **env}
    full.pop("GITHUB_STEP_SUMMARY", None) if "GITHUB_STEP_SUMMARY" not in env else None
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=full, capture_output=True, text=True, check=False)


@pytest.fixture
def project(tmp_path: Path, fidelity_run: Path) -> Path:
    """The tiny project (its file is also called fidelity.toml) with baselines recorded on purpose and its
    captures cached."""
    root = tmp_path / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    return root


@pytest.mark.slow  # runs the tiny project's cases (under -n 2) and publishes them
def test_workflow_commands_run_here_and_write_the_job_summary(project: Path, tmp_path: Path) -> None:
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step's text\n")
    for cmd in _commands():  # verbatim, as the job runs them
        out = _sh(cmd, project, GITHUB_STEP_SUMMARY=str(summary))
        assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
    assert (project / "published" / "README.md").is_file() and (project / "fidelity-reports" / "ladder.md").is_file()
    text = summary.read_text()
    assert text.startswith("earlier step's text\n## fidelity: `fidelity.toml`")  # appended, never overwritten
    ladder = [r["candidate"] for r in json.loads((project / "fidelity-reports" / "ladder.json").read_text())["rows"]]
    assert sorted(ladder) == ["bad", "good"]
    for name in ladder:
        assert f"| {name} " in text
    assert "No failing fidelity case." in text
    # junit.xml (xunit2, pytest's default, under -W error::pytest.PytestWarning): no per-testcase properties,
    # every case's numbers as testsuite properties named by the case
    root = ET.parse(project / "junit.xml").getroot()
    assert not [p for c in root.iter("testcase") for p in c.iter("property")]
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    report = json.loads((project / "fidelity-reports" / "good" / "shard-02.json").read_text())
    assert float(props["good-shard02:fidelity_mean_kld"]) == pytest.approx(report["metrics"]["kld"]["mean"], rel=1e-12)
    assert float(props["good-shard02:fidelity_top1"]) == pytest.approx(report["metrics"]["top1"]["agreement"], rel=1e-12)
    assert sum(1 for k in props if k.endswith(":fidelity_p99")) == 8  # 2 candidates x 4 shards, from both workers


@pytest.mark.slow  # runs the tiny project's cases
def test_failing_cases_reach_the_job_summary_and_xunit1_has_per_case_numbers(project: Path, tmp_path: Path) -> None:
    root = project
    good = json.loads((root / "baselines" / "good.json").read_text())
    good["candidate"] = "bad"
    del good["identity"]  # held to good's thresholds, not to good's model (an identity mismatch fails first)
    (root / "baselines" / "bad.json").write_text(json.dumps(good))  # bad now held to good's thresholds
    summary = tmp_path / "summary.md"
    out = _sh("python -m pytest fidelity.toml -p no:cacheprovider -m fidelity --fidelity-report-dir r -W error "
              "-o junit_family=xunit1 --junitxml j1.xml", root, GITHUB_STEP_SUMMARY=str(summary))
    assert out.returncode == 1, out.stdout[-3000:]
    assert "4 failed, 4 passed" in out.stdout and "warning" not in out.stdout.lower()
    cases = list(ET.parse(root / "j1.xml").getroot().iter("testcase"))
    assert len(cases) == 8
    for case in cases:  # xunit1: per-testcase properties, where that schema has them
        names = {p.get("name") for p in case.iter("property")}
        assert names == {"fidelity_mean_kld", "fidelity_ci_low", "fidelity_ci_high", "fidelity_p99", "fidelity_top1"}
    text = summary.read_text()
    assert "### Failing cases (4)" in text
    for k in range(4):
        assert f"- `fidelity.toml::test_fidelity[bad-shard{k:02d}]`" in text
    assert "(max_mean_kld) (candidate bad, shard 00)" in text
    assert "update with: pytest fidelity.toml --fidelity-candidates bad --fidelity-update-baselines" in text
    assert "| bad " in text and "FAIL" in text


def test_no_summary_without_the_variable(tmp_path: Path) -> None:
    text = render("my.toml", ["| candidate |", "|---|", "| a |"], [{"candidate": "b", "status": "failed", "reason": "no config"}],
                  [("my.toml::test_fidelity[a-shard00]", "x\n" * 40)])
    assert "- not in the ladder: `b`: failed: no config" in text and "... (10 more lines in the job log)" in text
    assert text.count("\n  x") == 30
