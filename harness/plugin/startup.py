"""What a run checks and sets up before it collects: option combinations, the executor
(``--fidelity-executor``) and the report folder (another suite's reports, a tampered ledger, a symbolic
link, a killed run's half-written files). Each problem is a usage error that names the option or file."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import FidelityError, MissingPackageError, UsageError
from harness.plugin import tracker
from harness.plugin.plan import FidelityPlan, collected_paths
from harness.reports.report_dir import SUMMARY_FOLDERS, finish_interrupted_writes
from harness.reports.report_folder import check_for_writing
from harness.run.cluster.ray_executor import RayExecutor, parse_executor, require_ray


def check_options(config: pytest.Config, path: Path, how: str) -> None:
    """Option combinations a run cannot take (``-n`` with an update or an adaptive run outside
    ``--dist loadgroup``, two configuration files, ``--fidelity-mlflow`` without mlflow)."""
    if config.getoption("fidelity_update_baselines") and config.getoption("numprocesses", None):
        raise UsageError("--fidelity-update-baselines cannot be combined with -n (pytest-xdist): "
                                "run the update serially so one process writes the baseline files")
    if (config.getoption("fidelity_adaptive") and config.getoption("numprocesses", None)
            and config.getoption("dist", None) != "loadgroup"):
        raise UsageError("--fidelity-adaptive with -n needs --dist loadgroup, "
                                "so each candidate's shards run in order on one worker")
    if how == "option" and config.args_source == pytest.Config.ArgsSource.ARGS:
        for other in collected_paths(config):
            if other.suffix == ".toml" and other != path:
                raise UsageError(f"pytest was pointed at {other} but --fidelity-config names {path}: give one")
    if config.getoption("fidelity_mlflow", None):
        if not tracker.available():
            raise MissingPackageError("mlflow", tracker.INSTALL, needed_for="--fidelity-mlflow")


def executor_for(config: pytest.Config, plan: FidelityPlan) -> RayExecutor | None:
    """``--fidelity-executor``: None for serial; a Ray executor (not yet started) otherwise. Without the
    Ray extra, or combined with pytest-xdist, a usage error that says what to do."""
    spec = parse_executor(config.getoption("fidelity_executor"))
    if spec.kind == "serial":
        return None
    try:
        require_ray()
    except MissingPackageError as exc:
        option = f"--fidelity-executor {config.getoption('fidelity_executor')}"
        raise MissingPackageError(exc.package, exc.install, hint=exc.hint,
                                 needed_for=f"{option}: {exc.needed_for}" if exc.needed_for else option) from None
    if config.getoption("numprocesses", None):
        raise UsageError("--fidelity-executor ray cannot be combined with -n (pytest-xdist): the cluster runs "
                                "the cases in parallel and this process writes every report")
    return RayExecutor(spec, plan.config, device=config.getoption("fidelity_device"),
                       score_from=config.getoption("fidelity_window"))


def check_report_dir(report_dir: Path, plan: FidelityPlan) -> None:
    """Refuse a report folder that holds the reports of another suite: they would be mixed into this run's
    ladder folder and aggregated together later. The folder is stamped at the end of each run
    (:mod:`harness.reports.report_dir`). A tampered ledger (a path outside the folder, a name this project
    does not write, a symbolic link on the way) and a folder the run writes into that is a symbolic link
    are refused too: a run never deletes or writes outside its report folder. The rule is every writer's
    (:func:`harness.reports.report_folder.check_for_writing`)."""
    check_for_writing(report_dir, plan.suite_sha256, option="--fidelity-report-dir",
                      entries=(*SUMMARY_FOLDERS, *(c.name for c in plan.full.candidates)))


def finish_interrupted(report_dir: Path) -> None:
    """Controller: what a killed earlier run left half-written in the report folder is completed or
    removed before this run writes (:func:`harness.reports.report_dir.finish_interrupted_writes`)."""
    try:
        finish_interrupted_writes(report_dir)
    except FidelityError as e:
        raise UsageError(f"{e}; remove it (or the report folder) or pass --fidelity-report-dir DIR") from None

