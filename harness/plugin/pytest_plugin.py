"""pytest plugin (entry point ``fidelity``): options, markers, fixtures; the rest is :class:`FidelityRun`.

The plugin stays in its lane. In a project without a fidelity configuration (no ``--fidelity-config``,
no ``.toml`` argument, no ``<rootdir>/fidelity.toml``) it only adds its options and its own markers:
it creates no run, collects, skips and reports nothing. With a configuration, one
:class:`harness.plugin.run.FidelityRun` holds the plan, the session, the adaptive monitor and the
reporter, and implements the hooks. Nothing heavy (torch, transformers) is imported until a
fidelity case runs, so ``pytest --help`` stays fast.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from harness.plugin.run import PARAMETRIZED, RUN_KEY, FidelityRun, active_run

if TYPE_CHECKING:
    from harness.inputs.config import PairConfig
    from harness.plugin.cases import PairCase, TailCase, WindowCase
    from harness.run.session import FidelitySession, ScoredShard

#: The plugin's own markers (``--strict-markers`` safe); generic names are left to each project.
MARKERS = {
    "fidelity": "a candidate x shard fidelity case",
    "fidelity_tails": "fidelity tail reports (percentiles, CVaR, exceedances)",
    "fidelity_window": "fidelity scoring-window controls",
    "fidelity_paired": "fidelity paired comparisons of two candidates",
    "fidelity_cross_engine": "fidelity cross-engine floor (same weights, two engines)",
    "fidelity_attribute": "fidelity_attribute(candidate, by='layer,kind', shards=None, modes='restore,only', globs=()): "
                          "attribute the candidate's drift to tensor groups (fixture fidelity_attribution)",
    "fidelity_precision_floor": "fidelity_precision_floor(shards=None, dtype='float64'): the reference capture against a "
                                "higher-precision forward of its own weights (fixture fidelity_precision_floor)",
}


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


def _executor(value: str) -> str:
    from harness.errors import FidelityError
    from harness.run.ray_executor import parse_executor

    try:
        parse_executor(value)
    except FidelityError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("executor: ")) from None
    return value


def _names(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+]*(,[A-Za-z0-9][A-Za-z0-9_.+]*)*", value):
        raise argparse.ArgumentTypeError(f"expected candidate names like 'int8,int4_g32', found {value!r}")
    return value


# ---------------------------------------------------------------- options and markers
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(
        "fidelity",
        "fidelity harness (KL divergence of quantized models). Environment: FIDELITY_THREADS=N sets the torch CPU "
        "threads (default: the free cores = cores minus the one-minute load average, at least 1; under -n W each "
        "worker gets free cores // W)",
    )
    group.addoption("--fidelity-config", dest="fidelity_config", metavar="PATH", default=None,
                    help="fidelity.toml to use; its cases are collected wherever pytest runs "
                         "(default: a .toml file given as an argument, else <rootdir>/fidelity.toml)")
    group.addoption("--fidelity-candidates", dest="fidelity_candidates", metavar="NAMES", type=_names, default=None,
                    help="candidates to run, exact names, e.g. 'int8,int4_g32' (default: all)")
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
    group.addoption("--fidelity-executor", dest="fidelity_executor", metavar="WHERE", type=_executor, default="serial",
                    help="where the candidate x shard cases run: serial (this process, default), ray (a local Ray "
                         "cluster started for the run), ray:auto (the cluster this machine joined with ray start), "
                         "ray:HOST:PORT (a cluster's head), ray://HOST:PORT (Ray Client); needs the ray extra: "
                         "pip install 'fidelity-harness[ray]'")
    group.addoption("--fidelity-mlflow", dest="fidelity_mlflow", metavar="URI", default=None,
                    help="log the run's per-shard metrics, ladder and plots to this MLflow tracking URI "
                         "(needs: pip install 'fidelity-harness[mlflow]')")
    group.addoption("--fidelity-adaptive", dest="fidelity_adaptive", action="store_true",
                    help="stop scoring a candidate's shards once its interval (Bonferroni alpha spending over "
                         "the planned shards) lies on one side of its baseline's max_mean_kld")


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    run = FidelityRun.configure(config)
    if run is not None:
        config.stash[RUN_KEY] = run
        config.pluginmanager.register(run, "fidelity-run")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if RUN_KEY not in metafunc.config.stash and any(f in metafunc.fixturenames for f in PARAMETRIZED):
        active_run(metafunc.config)  # fails: a fidelity case without a configuration


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def fidelity_session(request: pytest.FixtureRequest) -> FidelitySession:
    """The run's :class:`harness.run.session.FidelitySession` (suite, head, reference, candidates)."""
    return active_run(request.config).session


@pytest.fixture
def fidelity_case(request: pytest.FixtureRequest) -> tuple[str, int]:
    """``(candidate name, shard number)`` of this case."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def fidelity_scored(request: pytest.FixtureRequest, fidelity_case: tuple[str, int]) -> Iterator[ScoredShard]:
    """Score this candidate x shard; the report travels home with the test report (its headline numbers go to
    ``--junitxml`` as :mod:`harness.plugin.junit` says)."""
    yield active_run(request.config).score(request, *fidelity_case)


@pytest.fixture
def fidelity_gate(request: pytest.FixtureRequest) -> Any:
    """Checks a scored case against its committed baseline (or records it for an update)."""
    from harness.gate.gate import Gate

    run = active_run(request.config)
    return Gate(baselines=run.plan.config.baselines, update=request.config.getoption("fidelity_update_baselines"),
                config_path=run.plan.path, selector=run.plan.selector)


@pytest.fixture
def fidelity_tail_candidate(request: pytest.FixtureRequest) -> str:
    """Name of the candidate of this tail case."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def fidelity_tails(request: pytest.FixtureRequest, fidelity_tail_candidate: str) -> TailCase:
    """This candidate's tail report over the selected shards (:class:`harness.plugin.cases.TailCase`)."""
    return active_run(request.config).tails(request, fidelity_tail_candidate)


@pytest.fixture
def fidelity_window_k(request: pytest.FixtureRequest) -> tuple[int, tuple[str, ...]]:
    """``(score_from, notes)`` of this window case."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def fidelity_window(request: pytest.FixtureRequest, fidelity_window_k: tuple[int, tuple[str, ...]]) -> WindowCase:
    """Every candidate rescored from row k (:class:`harness.plugin.cases.WindowCase`)."""
    return active_run(request.config).window(request, *fidelity_window_k)


@pytest.fixture
def fidelity_pair(request: pytest.FixtureRequest) -> PairConfig:
    """The declared pair (:class:`harness.inputs.config.PairConfig`) of this paired case."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def fidelity_paired(request: pytest.FixtureRequest, fidelity_pair: PairConfig) -> PairCase:
    """The pair compared on the same positions (:class:`harness.plugin.cases.PairCase`)."""
    return active_run(request.config).paired(request, fidelity_pair)


@pytest.fixture
def fidelity_attribution(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The ``fidelity_attribute`` marker's attribution (:func:`harness.attribution.run.attribute`) of a configured
    candidate against the configured reference model; written to ``<report dir>/attribution/<candidate>/``."""
    from harness.attribution.render import write_attribution
    from harness.attribution.run import attribute, request_from

    mark = request.node.get_closest_marker("fidelity_attribute")
    if mark is None or not (mark.args or "candidate" in mark.kwargs):
        pytest.fail("fidelity_attribution needs @pytest.mark.fidelity_attribute(candidate=NAME, ...)", pytrace=False)
    kw = dict(mark.kwargs)
    name = kw.pop("candidate", mark.args[0] if mark.args else "")
    cfg = active_run(request.config).plan.config
    cand = cfg.candidate(name)
    if cfg.reference.model is None or cand.model is None:
        pytest.fail(f"attribution of {name!r} needs reference.model and the candidate's model in the configuration", pytrace=False)
    result = attribute(request_from(cfg.reference.model, cand.model, cfg.suite, progress=False, **kw))
    from pathlib import Path

    write_attribution(result, Path(request.config.getoption("fidelity_report_dir")) / "attribution" / name)
    return result


@pytest.fixture
def fidelity_precision_floor(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The ``fidelity_precision_floor`` marker's measurement (:func:`harness.run.precision_floor.precision_floor`) of
    the configured reference; written to ``<report dir>/precision_floor.json`` and ``.md``."""
    from pathlib import Path

    from harness.run.precision_floor import precision_floor, write_precision_floor

    mark = request.node.get_closest_marker("fidelity_precision_floor")
    kw = dict(mark.kwargs) if mark is not None else {}
    cfg = active_run(request.config).plan.config
    if cfg.reference.model is None:
        pytest.fail("the precision floor needs reference.model in the configuration", pytrace=False)
    result = precision_floor(suite_path=cfg.suite, model_dir=cfg.reference.model, store_path=cfg.reference.store,
                             head_path=cfg.reference.head, n_boot=cfg.n_boot, **kw)
    write_precision_floor(result, Path(request.config.getoption("fidelity_report_dir")))
    return result
