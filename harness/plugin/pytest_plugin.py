"""pytest plugin: a thin adapter over the harness library.

Reads like a table of contents: options, markers, parametrization, fixtures,
artifact writing, summary. The work happens in :mod:`harness.run.session`,
:mod:`harness.plugin.ladder` and :mod:`harness.gate.baselines`; nothing heavy (torch,
transformers) is imported until a fidelity case runs, so ``pytest --help`` stays fast.

Workers report, the controller writes: each case attaches its report to the
pytest ``TestReport`` (serialized home by pytest-xdist); only the controller, in
``pytest_runtest_logreport``, writes the per-shard artifacts and the ladder.
"""

from __future__ import annotations

import argparse
import json
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
TAIL_FIXTURE = "fidelity_tail_candidate"
WINDOW_FIXTURE = "fidelity_window_k"
PAIR_FIXTURE = "fidelity_pair"
PAYLOAD_ATTR = "fidelity_payload"
EXTRA_ATTR = "fidelity_extra"


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
    group.addoption("--fidelity-adaptive", dest="fidelity_adaptive", action="store_true",
                    help="stop scoring a candidate's shards once its interval (Bonferroni alpha spending over "
                         "the planned shards) lies on one side of its baseline's max_mean_kld")


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    if config.getoption("fidelity_update_baselines") and _xdist_workers(config):
        raise pytest.UsageError(
            "--fidelity-update-baselines cannot be combined with -n (pytest-xdist): "
            "run the update serially so one process writes the baseline files"
        )
    if config.getoption("fidelity_adaptive") and _xdist_workers(config) and config.getoption("dist", None) != "loadgroup":
        raise pytest.UsageError(
            "--fidelity-adaptive with -n needs --dist loadgroup, so each candidate's shards run in order on one worker"
        )
    if config.getoption("fidelity_config") or _config_path(config).is_file():
        config.stash[_PLAN] = _plan(config)  # validates at startup: errors are usage errors
    if not _is_worker(config):
        config.pluginmanager.register(FidelityReporter(config), "fidelity-reporter")
    else:  # -n W: each worker gets cores // W torch threads (harness/scoring/threads.py)
        from harness.scoring.threads import apply_worker_threads
        apply_worker_threads(int(config.workerinput.get("workercount", 1)))


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
    from harness.inputs.config import load_config
    from harness.errors import FidelityError

    try:
        return load_config(_config_path(config))
    except FidelityError as exc:
        raise pytest.UsageError(str(exc)) from None


def _session(config: pytest.Config) -> Any:
    if _SESSION not in config.stash:
        from harness.run.session import FidelitySession, resolve_device

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
    from harness.inputs.suite import Suite, parse_shard_spec

    cfg = _fidelity_config(config)
    try:
        n_shards = len(Suite.load(cfg.suite, verify=False).shards)
        spec = config.getoption("fidelity_shards")
        shards = parse_shard_spec(spec, n_shards) if spec else list(range(n_shards))
    except FidelityError as exc:
        raise pytest.UsageError(str(exc)) from None
    return cfg, shards


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for fixture, make_params in ((TAIL_FIXTURE, _tail_params), (WINDOW_FIXTURE, _window_params), (PAIR_FIXTURE, _pair_params)):
        if fixture in metafunc.fixturenames:
            metafunc.parametrize(fixture, make_params(_require_plan(metafunc)))
    if CASE_FIXTURE in metafunc.fixturenames:
        metafunc.parametrize(CASE_FIXTURE, _case_params(_require_plan(metafunc)), indirect=True)


def _case_params(plan: tuple[Any, list[int]]) -> list[Any]:
    """One case per candidate x selected shard, ids ``<candidate>-shard<NN>``, grouped per candidate for xdist."""
    cfg, shards = plan
    return [
        pytest.param((c.name, s), id=f"{c.name}-shard{s:02d}", marks=pytest.mark.xdist_group(c.name))
        for c in cfg.candidates
        for s in shards
    ]


def _require_plan(metafunc: pytest.Metafunc) -> tuple[Any, list[int]]:
    if _PLAN not in metafunc.config.stash:
        pytest.fail(f"{_config_path(metafunc.config)}: no fidelity configuration found; "
                    "create fidelity.toml at the rootdir or pass --fidelity-config PATH", pytrace=False)
    return metafunc.config.stash[_PLAN]  # type: ignore[no-any-return]


def _tail_params(plan: tuple[Any, list[int]]) -> list[Any]:
    return [pytest.param(c.name, id=f"tails-{c.name}", marks=[pytest.mark.tails, pytest.mark.xdist_group(c.name)])
            for c in plan[0].candidates]


def _window_params(plan: tuple[Any, list[int]]) -> list[Any]:
    from harness.inputs.suite import Suite
    from harness.reports.windows import planned_windows

    cfg, _ = plan
    n_ctx = Suite.load(cfg.suite, verify=False).n_ctx
    run, notes = planned_windows(n_ctx)
    params = [pytest.param((k, tuple(notes)), id=f"window-from{k}", marks=pytest.mark.window) for k in run]
    for note in notes:
        k = int(note.split()[0].split("=")[1])
        params.append(pytest.param((k, ()), id=f"window-from{k}", marks=[pytest.mark.window, pytest.mark.skip(reason=note)]))
    return params


def _pair_params(plan: tuple[Any, list[int]]) -> list[Any]:
    return [pytest.param(p, id=f"pair-{p.a}-vs-{p.b}", marks=pytest.mark.paired) for p in plan[0].pairs]


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
        planned: dict[str, list[int]] = {}
        for name, shard in cases:
            planned.setdefault(name, []).append(shard)
        session.config.stash[_PLANNED] = planned


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def fidelity_session(request: pytest.FixtureRequest) -> Any:
    """The run's :class:`harness.run.session.FidelitySession` (suite, head, reference, candidates)."""
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
    monitor = _adaptive(request.config)
    if monitor is not None and monitor.stop_reason(name):
        pytest.skip(monitor.stop_reason(name))
    try:
        scored = fidelity_session.score(fidelity_session.config.candidate(name), shard)
    except FidelityError as exc:
        pytest.fail(f"{name} shard {shard:02d}: {exc}", pytrace=False)
    if monitor is not None:
        d = monitor.observe(name, shard, scored.report.metrics)
        _send(request, "adaptive", {"candidate": name, "shard": shard, "look": d.look, "looks": d.looks, "level": d.level,
                                    "ci": list(d.ci), "mean_kld": d.mean_kld, "threshold": d.threshold, "side": d.side})
    h = scored.headline
    for key in ("mean_kld", "ci_low", "ci_high", "p99", "top1"):
        record_property(f"fidelity_{key}", getattr(h, key))
    request.node.stash[_PAYLOAD] = scored.report.to_json_dict()
    yield scored


@pytest.fixture
def fidelity_gate(request: pytest.FixtureRequest, fidelity_session: Any) -> Any:
    """Checks a scored case against its committed baseline (or records it for an update)."""
    from harness.gate.gate import Gate

    return Gate(
        baselines=fidelity_session.config.baselines,
        update=request.config.getoption("fidelity_update_baselines"),
        config_path=fidelity_session.config.path,
    )


_PAYLOAD = pytest.StashKey[dict]()
_EXTRA = pytest.StashKey[list]()
_ADAPTIVE = pytest.StashKey[Any]()
_PLANNED = pytest.StashKey[dict]()


def _send(request: pytest.FixtureRequest, kind: str, data: dict[str, Any]) -> None:
    """Queue a report-case payload to travel home with this test's report."""
    request.node.stash.setdefault(_EXTRA, []).append({"kind": kind, "data": data})


def _adaptive(config: pytest.Config) -> Any:
    """The process's adaptive monitor (``--fidelity-adaptive``), or None."""
    if not config.getoption("fidelity_adaptive"):
        return None
    if _ADAPTIVE not in config.stash:
        from harness.gate.adaptive import AdaptiveMonitor, threshold_for

        cfg = config.stash[_PLAN][0]
        planned = config.stash.get(_PLANNED, {})
        thresholds = {n: threshold_for(cfg.baselines, n, s) for n, s in planned.items()}
        config.stash[_ADAPTIVE] = AdaptiveMonitor(planned=planned, thresholds=thresholds)
    return config.stash[_ADAPTIVE]


@pytest.fixture
def fidelity_tail_candidate(request: pytest.FixtureRequest) -> str:
    """Name of the candidate of this tail case."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def fidelity_tails(request: pytest.FixtureRequest, fidelity_session: Any, fidelity_tail_candidate: str) -> Any:
    """This candidate's tail report over the selected shards (:class:`harness.plugin.cases.TailCase`)."""
    from harness.plugin.cases import TailCase

    shards = request.config.stash[_PLAN][1]
    monitor = _adaptive(request.config)
    if monitor is not None and fidelity_tail_candidate in monitor.stopped:  # tails of the shards actually scored
        shards = sorted(monitor.seen[fidelity_tail_candidate])
    case = TailCase.run(fidelity_session, fidelity_tail_candidate, shards)
    _send(request, "tails", case.payload)
    return case


@pytest.fixture
def fidelity_window_k(request: pytest.FixtureRequest) -> tuple[int, tuple[str, ...]]:
    """``(score_from, notes)`` of this window case."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def fidelity_window(request: pytest.FixtureRequest, fidelity_session: Any, fidelity_window_k: tuple[int, tuple[str, ...]]) -> Any:
    """Every candidate rescored from row k (:class:`harness.plugin.cases.WindowCase`)."""
    from harness.plugin.cases import WindowCase

    k, notes = fidelity_window_k
    case = WindowCase.run(fidelity_session, k, request.config.stash[_PLAN][1], notes)
    _send(request, "window", case.payload)
    return case


@pytest.fixture
def fidelity_pair(request: pytest.FixtureRequest) -> Any:
    """The declared pair (:class:`harness.inputs.config.PairConfig`) of this paired case."""
    return request.param


@pytest.fixture
def fidelity_paired(request: pytest.FixtureRequest, fidelity_session: Any, fidelity_pair: Any) -> Any:
    """The pair compared on the same positions (:class:`harness.plugin.cases.PairCase`)."""
    from harness.plugin.cases import PairCase
    from harness.errors import FidelityError

    p = fidelity_pair
    try:
        case = PairCase.run(fidelity_session, p.a, p.b, p.margin, request.config.stash[_PLAN][1], p.expect)
    except FidelityError as exc:
        pytest.fail(f"pair {p.a} vs {p.b}: {exc}", pytrace=False)
    _send(request, "paired", case.payload)
    return case


# ---------------------------------------------------------------- artifacts
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if call.when == "call" and _PAYLOAD in item.stash:
        setattr(report, PAYLOAD_ATTR, json.dumps(item.stash[_PAYLOAD], sort_keys=True))
    if call.when == "call" and _EXTRA in item.stash:
        setattr(report, EXTRA_ATTR, json.dumps(item.stash[_EXTRA], sort_keys=True))


# ---------------------------------------------------------------- controller
class FidelityReporter:
    """Controller-side plugin: writes artifacts as reports arrive, the ladder at the end."""

    def __init__(self, config: pytest.Config) -> None:
        from harness.plugin.ladder import LadderCollector

        self.config = config
        self.collector = LadderCollector(report_dir=Path(config.getoption("fidelity_report_dir")))
        self.extras: dict[str, list[dict[str, Any]]] = {}
        self.extra_lines: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, PAYLOAD_ATTR, None)
        if payload is not None and report.when == "call":
            self.collector.add(json.loads(payload), passed=report.passed)
        extra = getattr(report, EXTRA_ATTR, None)
        if extra is not None and report.when == "call":
            for item in json.loads(extra):
                self.extras.setdefault(item["kind"], []).append(item["data"])

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.collector.reports:
            self.collector.finish(
                update_baselines=self.config.getoption("fidelity_update_baselines"),
                config=self.config.stash[_PLAN][0],
            )
        if self.extras:
            from harness.plugin.cases import write_extras

            self.extra_lines = write_extras(self.collector.report_dir, self.extras)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.collector.reports:
            terminalreporter.section("fidelity ladder")
            for line in self.collector.summary_lines():
                terminalreporter.write_line(line)
        if self.extra_lines:
            terminalreporter.section("fidelity reports")
            for line in self.extra_lines:
                terminalreporter.write_line(line)
