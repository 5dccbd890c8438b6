"""Interrupt safety: ``kill -9`` in the middle of a run, rerun, and the result is what an
uninterrupted run gives — nothing right is lost, nothing half-written is taken for whole.

tests/test_capture.py already kills one of two *concurrent* capture processes (the survivor
finishes). Here a lone ``fidelity capture`` (the console command's code path) is killed and the
store is finished by a *rerun*, which must also clear the killed writer's temporaries; and a whole
``pytest`` run of the tiny project is killed after its first report and rerun. Each costs one
subprocess (~10 s to import torch/transformers on this machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # kill -9 of captures and pytest runs, then reruns

_SLOW_CLI_CAPTURE = textwrap.dedent(
    """
    import sys, time
    import harness.engines.transformers as T
    orig = T.capture_hidden
    def slow(model, ids):
        time.sleep(0.3)
        return orig(model, ids)
    T.capture_hidden = slow
    from harness.cli.main import main
    sys.exit(main(sys.argv[1:]))
    """
)

_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _listed(store: Path) -> int:
    try:
        return len(json.loads((store / "capture.json").read_text())["files"])
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def _wait_for(cond: Any, proc: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            err = proc.stderr.read().decode()[-3000:] if proc.stderr else ""
            pytest.fail(f"subprocess ended (rc {proc.returncode}) before {what}:\n{err}")
        assert time.monotonic() < deadline, f"no progress: {what}"
        time.sleep(0.01)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_kill_9_during_fidelity_capture_then_rerun(tmp_path: Path, fidelity_project: Path) -> None:
    """SIGKILL a lone `fidelity capture` mid-way; a rerun finishes it and the store equals an
    uninterrupted capture byte for byte (manifest included), with no temporaries left."""
    from harness.capture.loop import capture

    script = tmp_path / "slow_cli.py"
    script.write_text(_SLOW_CLI_CAPTURE)
    store = tmp_path / "store"
    model, suite = fidelity_project / "models" / "reference", fidelity_project / "suite"
    proc = subprocess.Popen([sys.executable, str(script), "capture", "--model", str(model), "--suite", str(suite),
                             "--out", str(store), "--quiet", "--threads", "1"],
                            env=_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: _listed(store) >= 3, proc, "three contexts were captured")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert 3 <= _listed(store) < 8, "the kill did not land mid-capture"
    # what a kill inside an atomic write leaves behind: a temporary, never under the final name
    (store / ".ctx-000007.safetensors.abc123.tmp").write_bytes(b"half a tensor")
    (store / ".capture.json.def456.tmp").write_text('{"schema": "fidelity.capture/1", "fi')
    capture("transformers", model, suite, store, progress=False)
    assert _tree(store) == _tree(fidelity_project / "reference")


_SLOW_CONFTEST = textwrap.dedent(
    """
    import time

    def pytest_runtest_teardown(item):
        time.sleep(0.4)
    """
)


def _strip(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in ("timing", "created")}


def _md(p: Path) -> list[str]:
    return [l for l in p.read_text().splitlines() if not l.startswith(("Schema ", "Timing: "))]


def test_kill_9_during_pytest_run_then_rerun(pytester: pytest.Pytester, fidelity_project: Path) -> None:
    """SIGKILL `pytest` after its first report; what it left is whole or absent; a rerun gives the
    reports of an uninterrupted run (apart from timing/created), and no temporaries."""
    from harness.reports.shard import ShardReport

    root = pytester.path
    shutil.copytree(fidelity_project, root, dirs_exist_ok=True)
    shutil.copytree(fidelity_project, root / "clean", )
    common = ["-p", "no:cacheprovider", "--fidelity-update-baselines", "-m", "fidelity"]
    clean = pytester.runpytest("clean/fidelity.toml", *common,
                               "--fidelity-report-dir", "clean-reports")
    clean.assert_outcomes(passed=8)

    (root / "conftest.py").write_text(_SLOW_CONFTEST)
    first = root / "fidelity-reports" / "good" / "shard-00.json"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "fidelity.toml", *common], cwd=root, env=_ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(first.exists, proc, "the first report was written")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    reports = root / "fidelity-reports"
    written = sorted(reports.rglob("shard-*.json"))
    assert 1 <= len(written) < 8 and not (reports / "ladder.json").exists(), "the kill did not land mid-run"
    for p in written:  # whole or absent: every report under its final name loads
        ShardReport.load(p)
    assert not (root / "baselines").exists(), "baselines written by a killed run"
    (root / "conftest.py").unlink()

    again = pytester.runpytest("fidelity.toml", *common)
    again.assert_outcomes(passed=8)
    for p in sorted((root / "clean-reports").rglob("shard-*.json")):
        rel = p.relative_to(root / "clean-reports")
        assert _strip(json.loads((reports / rel).read_text())) == _strip(json.loads(p.read_text())), rel
        assert _md(reports / rel.with_suffix(".md")) == _md(p.with_suffix(".md")), rel
    assert len(list(reports.rglob("shard-*.json"))) == 8
    assert json.loads((reports / "ladder.json").read_text()) == json.loads((root / "clean-reports" / "ladder.json").read_text())
    assert _tree(root / "baselines") == _tree(root / "clean" / "baselines")
    assert not [p for p in (root / ".fidelity-cache").rglob("*.tmp")], "temporaries left in the capture cache"
