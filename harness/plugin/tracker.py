"""One experiment tracker, optional: a run's numbers, ladder and plots logged to MLflow (``--fidelity-mlflow URI``).

Reasoning: docs/reports.md §"The MLflow tracker".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.errors import pip_extra
from harness.reports.aggregate import LadderLine
from harness.reports.shard import ShardReportJSON

EXPERIMENT = "fidelity"
INSTALL = pip_extra("mlflow")
SHARD_KEYS = ("mean_kld", "ci_low", "ci_high", "p99", "top1")


def available() -> bool:
    """Whether the ``mlflow`` package (or ``mlflow-skinny``) is importable."""
    import importlib.util

    return importlib.util.find_spec("mlflow") is not None


def metric_name(candidate: str, key: str) -> str:
    """``<candidate>/<key>`` in MLflow's alphabet (see docs/reports.md §"The MLflow tracker")."""
    return f"{candidate.replace('+', '-plus-')}/{key}"


def shard_metrics(reports: Sequence[ShardReportJSON]) -> list[tuple[str, float, int]]:
    """``(key, value, step)`` of every shard report's headline (step: the shard number)."""
    out = []
    for rep in reports:
        name, shard, m = str(rep["candidate"]), int(rep["comparability"]["shard"]["index"]), rep["metrics"]
        ci = m["kld"]["ci95"]
        values = {"mean_kld": m["kld"]["mean"], "p99": m["kld"]["p99"], "top1": m["top1"]["agreement"],
                  "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None}
        out += [(metric_name(name, k), float(v), shard) for k in SHARD_KEYS if (v := values[k]) is not None]
    return sorted(out, key=lambda t: (t[0], t[2]))


def ladder_metrics(rows: Sequence[LadderLine]) -> list[tuple[str, float]]:
    """``(key, value)`` of every ladder row (the run's aggregate per candidate)."""
    out = []
    for r in rows:
        name = str(r["candidate"])
        out.append((metric_name(name, "ladder_mean_kld"), float(r["mean_kld"])))
        if r["ci95"]:
            out += [(metric_name(name, "ladder_ci_low"), float(r["ci95"][0])),
                    (metric_name(name, "ladder_ci_high"), float(r["ci95"][1]))]
        out.append((metric_name(name, "ladder_top1"), float(r["top1"])))
        if size := r["size_bytes"]:
            out.append((metric_name(name, "size_bytes"), float(size)))
    return out


def log_run(uri: str, *, run_name: str, tags: Mapping[str, str], reports: Sequence[ShardReportJSON],
            rows: Sequence[LadderLine], files: Sequence[Path]) -> str:
    """Log one MLflow run (see docs/reports.md §"The MLflow tracker"); returns its run id. ``files``: the report folder's files
    this run wrote (the ladder files and the plots among them are logged as artifacts)."""
    import time

    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(EXPERIMENT)
    experiment = found.experiment_id if found is not None else client.create_experiment(EXPERIMENT)
    run = client.create_run(experiment, run_name=run_name)
    rid = run.info.run_id
    try:
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v, step in shard_metrics(reports)]
        metrics += [Metric(k, v, now, 0) for k, v in ladder_metrics(rows)]
        tag_list = [RunTag(k, str(v)) for k, v in tags.items()] + [RunTag(f"verdict/{r['candidate']}", str(r["verdict"]))
                                                                   for r in rows]
        for i in range(0, len(metrics), 500):  # MLflow's batch limit: 1000 metrics
            client.log_batch(rid, metrics=metrics[i:i + 500], tags=tag_list if i == 0 else [])
        if not metrics:
            client.log_batch(rid, tags=tag_list)
        for f in files:
            if f.name in ("ladder.md", "ladder.json") and f.is_file():
                client.log_artifact(rid, str(f))
            elif f.suffix == ".png" and f.is_file():
                client.log_artifact(rid, str(f), "plots")
    except Exception:
        client.set_terminated(rid, status="FAILED")
        raise
    client.set_terminated(rid)
    return str(rid)
