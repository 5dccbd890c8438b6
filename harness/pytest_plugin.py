"""pytest plugin: a thin adapter over the harness library.

Reads like a table of contents: options, markers, parametrization, fixtures,
artifact writing, summary. The work happens in :mod:`harness.session`,
:mod:`harness.ladder` and :mod:`harness.baselines`; nothing heavy (torch,
transformers) is imported until a fidelity case runs, so ``pytest --help`` stays fast.

Workers report, the controller writes: each case attaches its report to the
pytest ``TestReport`` (serialized home by pytest-xdist); only the controller, in
``pytest_runtest_logreport``, writes the per-shard artifacts and the ladder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

MARKERS = {
    "fidelity": "a candidate x shard fidelity case",
    "tails": "tail reports (percentiles, CVaR, exceedances)",
    "window": "scoring-window controls",
    "paired": "paired comparisons of two candidates",
    "cross_engine": "cross-engine floor (same weights, two engines)",
    "gpu": "needs a CUDA device",
    "slow": "slow test",
    "benchmark": "performance benchmark (pytest-benchmark); skipped unless --fidelity-benchmarks",
}

CASE_FIXTURE = "fidelity_case"
PAYLOAD_ATTR = "fidelity_payload"


# ---------------------------------------------------------------- option types
def _shard_spec(value: str) -> str:
    if not re.fullmatch(r"\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*", value):
        raise argparse.ArgumentTypeError(f"expected shard numbers like '0,2-3', found {value!r}")
    return value


def _device(value: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, found {value!r}")
    return value


def _window(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a row count >= 0, found {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a row count >= 0, found {n}")
    return n


# ---------------------------------------------------------------- options
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fidelity", "fidelity harness (KL divergence of quantized models)")
    group.addoption("--fidelity-config", dest="fidelity_config", metavar="PATH", default=None,
                    help="fidelity.toml to use (default: <rootdir>/fidelity.toml)")
    group.addoption("--fidelity-shards", dest="fidelity_shards", metavar="SPEC", type=_shard_spec, default=None,
                    help="shards to run, e.g. '0,2-3' (default: all)")
    group.addoption("--fidelity-device", dest="fidelity_device", type=_device, default="auto",
                    help="device for live candidates and scoring: auto|cpu|cuda[:N] (default: auto)")
    group.addoption("--fidelity-report-dir", dest="fidelity_report_dir", metavar="DIR", default="fidelity-reports",
                    help="where per-shard reports and the ladder are written (default: fidelity-reports/)")
    group.addoption("--fidelity-window", dest="fidelity_window", metavar="N", type=_window, default=0,
                    help="score_from: drop the first N rows of every context (a different measurement)")
    group.addoption("--fidelity-update-baselines", dest="fidelity_update_baselines", action="store_true",
                    help="write measured values (plus the documented margin) to the baseline files")
    group.addoption("--fidelity-benchmarks", dest="fidelity_benchmarks", action="store_true",
                    help="run tests marked 'benchmark' (off by default and under xdist)")


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    if config.getoption("fidelity_update_baselines") and _xdist_workers(config):
        raise pytest.UsageError(
            "--fidelity-update-baselines cannot be combined with -n (pytest-xdist): "
            "run the update serially so one process writes the baseline files"
        )
    if config.getoption("fidelity_config") or _config_path(config).is_file():
        config.stash[_PLAN] = _plan(config)  # validates at startup: errors are usage errors
    if not _is_worker(config):
        config.pluginmanager.register(FidelityReporter(config), "fidelity-reporter")


def _xdist_workers(config: pytest.Config) -> int:
    n = getattr(config.option, "numprocesses", None)
    return int(n) if isinstance(n, int) else (1 if n else 0)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


# ---------------------------------------------------------------- session
_SESSION = pytest.StashKey[Any]()
_PLAN = pytest.StashKey[tuple[Any, list[int]]]()


def _config_path(config: pytest.Config) -> Path:
    opt = config.getoption("fidelity_config")
    return Path(opt) if opt else Path(config.rootpath) / "fidelity.toml"


def _fidelity_config(config: pytest.Config) -> Any:
    from harness.config import load_config
    from harness.errors import FidelityError

    try:
        return load_config(_config_path(config))
    except FidelityError as exc:
        raise pytest.UsageError(str(exc)) from None


def _session(config: pytest.Config) -> Any:
    if _SESSION not in config.stash:
        from harness.session import FidelitySession, resolve_device

        worker = getattr(config, "workerinput", {}).get("workerid")
        index = int(worker[2:]) if worker else None
        config.stash[_SESSION] = FidelitySession(
            config=config.stash[_PLAN][0],
            device=resolve_device(config.getoption("fidelity_device"), index),
            score_from=config.getoption("fidelity_window"),
        )
    return config.stash[_SESSION]


# ---------------------------------------------------------------- parametrization
def _plan(config: pytest.Config) -> tuple[Any, list[int]]:
    """The validated configuration and the selected shards (``--fidelity-shards``)."""
    from harness.errors import FidelityError
    from harness.suite import Suite, parse_shard_spec

    cfg = _fidelity_config(config)
    try:
        n_shards = len(Suite.load(cfg.suite, verify=False).shards)
        spec = config.getoption("fidelity_shards")
        shards = parse_shard_spec(spec, n_shards) if spec else list(range(n_shards))
    except FidelityError as exc:
        raise pytest.UsageError(str(exc)) from None
    return cfg, shards


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if CASE_FIXTURE not in metafunc.fixturenames:
        return
    if _PLAN not in metafunc.config.stash:
        pytest.fail(
            f"{_config_path(metafunc.config)}: no fidelity configuration found; "
            "create fidelity.toml at the rootdir or pass --fidelity-config PATH",
            pytrace=False,
        )
    cfg, shards = metafunc.config.stash[_PLAN]
    params = [
        pytest.param((c.name, s), id=f"{c.name}-shard{s:02d}", marks=pytest.mark.xdist_group(c.name))
        for c in cfg.candidates
        for s in shards
    ]
    metafunc.parametrize(CASE_FIXTURE, params, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("fidelity_benchmarks") and not _xdist_workers(config):
        return
    why = "timing is off under xdist" if _xdist_workers(config) else "benchmarks run with --fidelity-benchmarks"
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "benchmark" in item.keywords and item.get_closest_marker("benchmark"):
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    cases = [item.callspec.params[CASE_FIXTURE] for item in session.items
             if hasattr(item, "callspec") and CASE_FIXTURE in item.callspec.params]
    if cases:
        _session(session.config).plan(cases)


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def fidelity_session(request: pytest.FixtureRequest) -> Any:
    """The run's :class:`harness.session.FidelitySession` (suite, head, reference, candidates)."""
    return _session(request.config)


@pytest.fixture
def fidelity_case(request: pytest.FixtureRequest) -> tuple[str, int]:
    """``(candidate name, shard number)`` of this case."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def fidelity_scored(request: pytest.FixtureRequest, fidelity_session: Any, fidelity_case: tuple[str, int],
                    record_property: Any) -> Iterator[Any]:
    """Score this candidate x shard; the report travels home with the test report."""
    from harness.errors import FidelityError

    name, shard = fidelity_case
    try:
        scored = fidelity_session.score(fidelity_session.config.candidate(name), shard)
    except FidelityError as exc:
        pytest.fail(f"{name} shard {shard:02d}: {exc}", pytrace=False)
    h = scored.headline
    for key in ("mean_kld", "ci_low", "ci_high", "p99", "top1"):
        record_property(f"fidelity_{key}", getattr(h, key))
    request.node.stash[_PAYLOAD] = scored.report.to_json_dict()
    yield scored


@pytest.fixture
def fidelity_gate(request: pytest.FixtureRequest, fidelity_session: Any) -> Any:
    """Checks a scored case against its committed baseline (or records it for an update)."""
    from harness.gate import Gate

    return Gate(
        baselines=fidelity_session.config.baselines,
        update=request.config.getoption("fidelity_update_baselines"),
        config_path=fidelity_session.config.path,
    )


_PAYLOAD = pytest.StashKey[dict]()


# ---------------------------------------------------------------- artifacts
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if call.when == "call" and _PAYLOAD in item.stash:
        setattr(report, PAYLOAD_ATTR, json.dumps(item.stash[_PAYLOAD], sort_keys=True))


# ---------------------------------------------------------------- controller
class FidelityReporter:
    """Controller-side plugin: writes artifacts as reports arrive, the ladder at the end."""

    def __init__(self, config: pytest.Config) -> None:
        from harness.ladder import LadderCollector

        self.config = config
        self.collector = LadderCollector(report_dir=Path(config.getoption("fidelity_report_dir")))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, PAYLOAD_ATTR, None)
        if payload is not None and report.when == "call":
            self.collector.add(json.loads(payload), passed=report.passed)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.collector.reports:
            self.collector.finish(
                update_baselines=self.config.getoption("fidelity_update_baselines"),
                config=self.config.stash[_PLAN][0],
            )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.collector.reports:
            terminalreporter.section("fidelity ladder")
            for line in self.collector.summary_lines():
                terminalreporter.write_line(line)
