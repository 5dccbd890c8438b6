"""``--fidelity-mlflow URI``: the run's per-shard metrics, ladder and plots in a local MLflow file store, read back
with MLflow's own client (skipped where the optional mlflow package is not installed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.plugin.tracker import metric_name, shard_metrics


def test_metric_names_and_shard_points() -> None:
    assert metric_name("int4_g32.hf", "mean_kld") == "int4_g32.hf/mean_kld"
    assert metric_name("q4+imatrix", "top1") == "q4-plus-imatrix/top1"
    rep = {"candidate": "a", "comparability": {"shard": {"index": 3}},
           "metrics": {"kld": {"mean": 0.5, "p99": 2.0, "ci95": None}, "top1": {"agreement": 0.9}}}
    assert shard_metrics([rep]) == [("a/mean_kld", 0.5, 3), ("a/p99", 2.0, 3), ("a/top1", 0.9, 3)]  # no interval: no point


@pytest.mark.slow  # runs the tiny project's shard and tail cases
def test_run_logged_to_a_local_file_store(fidelity_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this switch
    from mlflow.tracking import MlflowClient

    root = tmp_path / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    store = f"file://{tmp_path / 'mlruns'}"
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "-q", "-p", "no:cacheprovider", "-m",
                          "fidelity or fidelity_tails", "--fidelity-report-dir", "r", "--fidelity-mlflow", store],
                         cwd=root, env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "mlflow: run " in out.stdout
    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name("fidelity")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "fidelity.toml"
    assert run.data.tags["fidelity.suite_token_sha256"] == json.loads((root / "suite" / "suite.json").read_text())["suite_token_sha256"]
    for name in ("good", "bad"):
        history = client.get_metric_history(run.info.run_id, f"{name}/mean_kld")
        got = {m.step: m.value for m in history}
        want = {k: json.loads((root / "r" / name / f"shard-{k:02d}.json").read_text())["metrics"]["kld"]["mean"]
                for k in range(4)}
        assert got == pytest.approx(want, rel=1e-12)  # every shard's number, read from the reports independently
        ladder = {r["candidate"]: r for r in json.loads((root / "r" / "ladder.json").read_text())["rows"]}
        assert run.data.metrics[f"{name}/ladder_mean_kld"] == pytest.approx(ladder[name]["mean_kld"], rel=1e-12)
        assert run.data.tags[f"verdict/{name}"] == ladder[name]["verdict"]
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"ladder.md", "ladder.json", "plots"} <= arts
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {"plots/tails.png"}
    local = client.download_artifacts(run.info.run_id, "plots/tails.png", str(tmp_path / "dl"))
    assert Path(local).read_bytes() == (root / "r" / "tails.png").read_bytes()


def test_option_without_the_package_is_a_usage_error(pytester: pytest.Pytester, fidelity_project: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.plugin.tracker as tracker

    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    monkeypatch.setattr(tracker, "available", lambda: False)
    result = pytester.runpytest("--collect-only", "--fidelity-mlflow", "file:///nowhere")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fidelity-mlflow: mlflow is not installed: pip install 'fidelity-harness[[]mlflow[]]'*"])
