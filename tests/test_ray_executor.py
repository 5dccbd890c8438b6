"""The ladder on a Ray cluster (``--fidelity-executor ray``): a local cluster started for the run (this
machine's CPUs, object store capped at 512 MiB) runs every candidate x shard as a task; its report
folder equals a serial run's, also when a worker is SIGKILLed mid-task and when one candidate is broken.

The cluster runs the tiny project of tests/conftest.py (2 candidates x 4 shards, plus a broken one) and,
marked slow, two candidates x two shards of the embedded ladder (fidelity.toml)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.errors import FidelityError
from harness.run.cluster.ray_executor import ExecutorSpec, parse_executor
from harness.run.cluster.resources import TaskResources, task_resources

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- without a cluster
@pytest.mark.parametrize(("value", "want"), [
    ("serial", ExecutorSpec("serial")),
    ("ray", ExecutorSpec("ray", None)),
    ("ray:auto", ExecutorSpec("ray", "auto")),
    ("ray:10.0.0.5:6379", ExecutorSpec("ray", "10.0.0.5:6379")),
    ("ray://head.example:10001", ExecutorSpec("ray", "ray://head.example:10001")),
])
def test_parse_executor(value: str, want: ExecutorSpec) -> None:
    assert parse_executor(value) == want


@pytest.mark.parametrize("value", ["Ray", "ray:", "ray:head", "ray//h:1", "dask", "ray://h", "ray:h:port"])
def test_parse_executor_refuses(value: str) -> None:
    with pytest.raises(FidelityError, match="expected serial, ray, ray:auto, ray:HOST:PORT or ray://HOST:PORT"):
        parse_executor(value)


def test_task_resources_per_engine() -> None:
    assert task_resources("transformers", None, "a", gpu=False) == TaskResources(1, 0)
    assert task_resources("transformers", None, "a", gpu=True) == TaskResources(1, 1)
    assert task_resources(None, None, "replayed", gpu=True) == TaskResources(1, 1)
    assert task_resources("vllm", {"tensor_parallel_size": 4}, "big", gpu=True) == TaskResources(1, 4)
    assert task_resources("vllm", {"tensor_parallel_size": 4}, "big", gpu=False) == TaskResources(1, 0)
    assert task_resources("llamacpp", {"threads": 8}, "gguf", gpu=False) == TaskResources(8, 0)
    spread = {"device_map": "auto", "max_memory": {"0": "70GiB", "1": "70GiB", "cpu": "100GiB"}}
    assert task_resources("transformers", spread, "big", gpu=True) == TaskResources(1, 2)
    with pytest.raises(FidelityError, match=r"candidate big: options.tensor_parallel_size: expected an integer >= 1, found 0"):
        task_resources("vllm", {"tensor_parallel_size": 0}, "big", gpu=True)


@pytest.fixture
def project(pytester: pytest.Pytester, fidelity_project: Path) -> pytest.Pytester:
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    return pytester


def test_without_the_extra_the_option_says_how_to_install(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.run.cluster.ray_executor as rx

    monkeypatch.setattr(rx, "ray_installed", lambda: False)
    result = project.runpytest("--fidelity-executor", "ray", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("--fidelity-executor ray: the ray executor: ray is not installed: "
            "pip install 'fidelity-harness[ray]'") in result.stderr.str()
    help_text = project.runpytest("--help").stdout.str()
    assert "--fidelity-executor" in help_text and "fidelity-harness[ray]" in help_text


def test_ladder_command_without_the_extra_says_how_to_install(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import harness.run.cluster.ray_executor as rx
    from harness.cli.main import main

    monkeypatch.setattr(rx, "ray_installed", lambda: False)
    code = main(["ladder", str(project.path / "fidelity.toml"), "--executor", "ray", "--out", str(project.path / "out")])
    assert code == 3  # MissingPackageError's exit status
    assert "ray is not installed: pip install 'fidelity-harness[ray]'" in capsys.readouterr().err
    assert not (project.path / "out").exists()


def test_executor_with_xdist_is_a_usage_error(project: pytest.Pytester) -> None:
    pytest.importorskip("ray")
    result = project.runpytest("--fidelity-executor", "ray", "-n", "2", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fidelity-executor ray cannot be combined with -n*"])


# ---------------------------------------------------------------- on a local cluster
def _strip(d: dict[str, Any]) -> dict[str, Any]:
    """A shard report without what never counts (timing, creation time)."""
    return {k: v for k, v in d.items() if k not in ("timing", "created")}


def assert_same_reports(serial: Path, other: Path) -> int:
    """Every file of ``serial`` is in ``other`` and vice versa; shard reports equal except timing and creation
    time (their Markdown except those two lines); every summary byte-identical except the run ledger."""
    files = sorted(p.relative_to(serial) for p in serial.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(other) for p in other.rglob("*") if p.is_file())
    shards = 0
    for rel in files:
        a, b = serial / rel, other / rel
        if rel.name == "fidelity-run.json":  # the ledger names the run (command, time): never equal
            assert sorted(json.loads(a.read_text())["files"]) == sorted(json.loads(b.read_text())["files"])
        elif rel.name.startswith("shard-") and rel.suffix == ".json":
            shards += 1
            assert _strip(json.loads(a.read_text())) == _strip(json.loads(b.read_text())), rel
        elif rel.name == "precision_floor.json":  # measured in each run: equal but for its timing
            assert _strip(json.loads(a.read_text())) == _strip(json.loads(b.read_text())), rel
        elif rel.name.startswith("shard-") and rel.suffix == ".md":
            keep = [line for line in a.read_text().splitlines() if not line.startswith(("Schema ", "Timing: "))]
            assert keep == [line for line in b.read_text().splitlines() if not line.startswith(("Schema ", "Timing: "))], rel
        else:
            assert a.read_bytes() == b.read_bytes(), rel
    return shards


#: Seconds a run on the local cluster may take (its start and the workers' imports included) on a loaded machine.
RUN_TIMEOUT_S = 600

BROKEN = '''
[[candidates]]
name = "broken"
model = "models/broken"
'''


def _kill_first_task(proc: subprocess.Popen[bytes], captures: Path, deadline_s: float) -> int | None:
    """Once a task has begun writing a capture store under ``captures``, SIGKILL a Ray worker running a case's
    task (its process title is ``ray::run_case``): a worker killed while the cluster captures and scores.
    Waits for that event as long as the run lasts (up to ``deadline_s``, the run's own limit): on a loaded
    machine the cluster's start and the workers' imports take minutes, and a shorter wait gave up early."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        if not any(captures.glob("*/ctx-*.safetensors")):
            time.sleep(0.02)
            continue
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                title = (entry / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if title.startswith(b"ray::run_case"):
                os.kill(int(entry.name), signal.SIGKILL)
                return int(entry.name)
        time.sleep(0.02)
    return None


@pytest.mark.slow  # starts a local Ray cluster, captures and scores the tiny project twice
@pytest.mark.xdist_group("ray")  # `-n 2 --dist loadgroup`: one local Ray cluster at a time, on one worker
def test_ray_run_equals_serial_and_survives_a_killed_worker(project: pytest.Pytester) -> None:
    """Serial, then on a local Ray cluster with one worker SIGKILLed mid-task: Ray retries the task, every case
    passes as it did serially, and the report folders are the same (no report duplicated, none partial).
    A broken candidate (its weights truncated) fails its own cases only, in both runs alike."""
    pytest.importorskip("ray")
    root = project.path
    shutil.copytree(root / "models" / "good", root / "models" / "broken")
    weights = root / "models" / "broken" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    (root / "fidelity.toml").write_text((root / "fidelity.toml").read_text() + BROKEN)
    common = ["-p", "no:cacheprovider", "-q"]
    serial = project.runpytest_subprocess(*common, "--fidelity-update-baselines", "--fidelity-report-dir", "serial")
    # broken: its 4 shard cases and its tail case end in errors (a named refusal before loading); the run-wide
    # window cases leave it out and pass with the rest
    serial.assert_outcomes(passed=13, errors=5, skipped=1)
    shutil.rmtree(root / ".fidelity-cache")  # the cluster captures the candidates itself
    written = {p.name: p.read_bytes() for p in (root / "baselines").iterdir()}
    shutil.rmtree(root / "baselines")  # the tail reports name the baselines they saw: none, as in the serial run
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *common, "--fidelity-executor", "ray",
                             "--fidelity-update-baselines", "--fidelity-report-dir", "ray"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    killed = _kill_first_task(proc, root / ".fidelity-cache" / "captures", deadline_s=RUN_TIMEOUT_S)
    out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    text = out.decode()
    assert killed is not None, text
    assert "13 passed, 1 skipped, 5 errors" in text, text
    assert "corrupt or truncated safetensors" in text, text  # broken's own refusal, raised by the driver as serially
    assert assert_same_reports(root / "serial", root / "ray") == 8
    assert {p.name: p.read_bytes() for p in (root / "baselines").iterdir()} == written  # the driver wrote them alike
    assert not list((root / "ray").rglob("*.tmp*"))
    assert "executor: ray (local cluster for this run); results from 1 node(s)" in text, text
    # the same cases without pytest: fidelity ladder on a local cluster writes the same shard reports and ladder
    cli = subprocess.run([sys.executable, "-m", "harness", "ladder", "fidelity.toml", "--executor", "ray",
                          "--out", "cli"], cwd=root, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert cli.returncode == 1, cli.stdout + cli.stderr  # broken's cases fail
    assert [line.split(":")[0] for line in cli.stderr.splitlines() if line.startswith("FAILED")] == \
        [f"FAILED broken shard {k:02d}" for k in range(4)], cli.stderr
    for rel in sorted(p.relative_to(root / "cli") for p in (root / "cli").rglob("shard-*.json")):
        assert _strip(json.loads((root / "serial" / rel).read_text())) == _strip(json.loads((root / "cli" / rel).read_text()))
    assert len(list((root / "cli").rglob("shard-*.json"))) == 8
    ladders = [json.loads((root / d / "ladder.json").read_text()) for d in ("serial", "cli")]
    # the pytest run measures the precision floor and rates each row against it; `fidelity ladder` does not
    unfloored = [[{k: v for k, v in r.items() if k not in ("floor_ratio", "vs_floor")} for r in lad["rows"]] for lad in ladders]
    assert unfloored[0] == unfloored[1]
    assert [(m["candidate"], m["status"]) for m in ladders[1]["not_measured"]] == [("broken", "failed")]


@pytest.mark.slow  # the embedded ladder's captures (shared with fidelity.toml's own cases) and a local Ray cluster
@pytest.mark.xdist_group("ray")  # `-n 2 --dist loadgroup`: one local Ray cluster at a time, on one worker
def test_embedded_ladder_on_ray_equals_serial(tmp_path: Path) -> None:
    """Two candidates x two shards of the embedded ladder (fidelity.toml): same reports as a serial run."""
    pytest.importorskip("ray")
    select = ["fidelity.toml", "-p", "no:cacheprovider", "-q", "--fidelity-candidates", "int8,int4_g32",
              "--fidelity-shards", "0-1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

    def run(*extra: str) -> str:
        done = subprocess.run([sys.executable, "-m", "pytest", *select, *extra], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run("--fidelity-executor", "ray", "--fidelity-report-dir", str(tmp_path / "ray"))
    run("--fidelity-report-dir", str(tmp_path / "serial"))
    assert assert_same_reports(tmp_path / "serial", tmp_path / "ray") == 4
