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
import inspect
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from harness.plugin.ini import IniKey, add_ini, apply_ini
from harness.plugin.kinds import ReportKind
from harness.plugin.registry import REPORT_KINDS
from harness.plugin.run import PARAMETRIZED, RUN_KEY, FidelityRun, active_run
from harness.run.cluster.ray_executor import executor_argument
from harness.scoring.backends import device_argument

if TYPE_CHECKING:
    from harness.run.session import FidelitySession, ScoredShard

#: The plugin's own markers (``--strict-markers`` safe): the candidate x shard cases', then each report
#: kind's (:mod:`harness.plugin.registry`); generic names are left to each project.
MARKERS = {
    "fidelity": "a candidate x shard fidelity case",
    **{kind.marker: kind.marker_doc for kind in REPORT_KINDS if kind.marker is not None},
}


# ---------------------------------------------------------------- option types
def _shard_spec(value: str) -> str:
    if not re.fullmatch(r"\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*", value):
        raise argparse.ArgumentTypeError(f"expected shard numbers like '0,2-3', found {value!r}")
    return value


def _window(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a row count >= 0, found {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a row count >= 0, found {n}")
    return n


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
    group.addoption("--fidelity-device", dest="fidelity_device", type=device_argument, default=None,
                    help="device for live candidates and scoring: auto|cpu|cuda[:N] (default: auto)")
    group.addoption("--fidelity-report-dir", dest="fidelity_report_dir", metavar="DIR", default=None,
                    help="where per-shard reports and the ladder are written (default: fidelity-reports/)")
    group.addoption("--fidelity-window", dest="fidelity_window", metavar="N", type=_window, default=None,
                    help="score_from: drop the first N rows of every context (a different measurement)")
    group.addoption("--fidelity-update-baselines", dest="fidelity_update_baselines", action="store_true",
                    help="write measured values (plus the documented margin) to the baseline files")
    group.addoption("--fidelity-executor", dest="fidelity_executor", metavar="WHERE", type=executor_argument, default=None,
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
    add_ini(parser, (CONFIG_KEY, *OPTION_KEYS))


#: ``fidelity_config``: read by :func:`harness.plugin.run.config_path` (after a ``.toml`` argument, before
#: ``<rootdir>/fidelity.toml``).
CONFIG_KEY = IniKey("fidelity_config", "--fidelity-config", "the fidelity.toml to use, relative to the ini file", path=True)
#: The other options a project may set once in its pytest settings (``--fidelity-update-baselines`` is a
#: one-off action, never a setting).
OPTION_KEYS = (
    IniKey("fidelity_candidates", "--fidelity-candidates", "candidates to run, e.g. int8,int4_g32", _names),
    IniKey("fidelity_shards", "--fidelity-shards", "shards to run, e.g. 0,2-3", _shard_spec),
    IniKey("fidelity_device", "--fidelity-device", "auto|cpu|cuda[:N] (default auto)", device_argument, "auto"),
    IniKey("fidelity_report_dir", "--fidelity-report-dir", "report folder, relative to the ini file (default "
           "fidelity-reports, relative to where pytest starts)", default="fidelity-reports", path=True),
    IniKey("fidelity_window", "--fidelity-window", "score_from: rows dropped per context (default 0)", _window, 0),
    IniKey("fidelity_executor", "--fidelity-executor", "serial, ray, ray:auto, ray:HOST:PORT (default serial)",
           executor_argument, "serial"),
    IniKey("fidelity_mlflow", "--fidelity-mlflow", "MLflow tracking URI"),
    IniKey("fidelity_adaptive", "--fidelity-adaptive", "true: stop a candidate's shards once its verdict is settled",
           switch=True),
)


def pytest_configure(config: pytest.Config) -> None:
    apply_ini(config, OPTION_KEYS)  # before anything reads an option
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
    return active_run(request.config).gate()


def _param_fixture(name: str) -> Callable[..., object]:
    """A report kind's parameter fixture: its value is the case's parameter."""

    def param(request: pytest.FixtureRequest) -> object:
        return request.param

    param.__name__ = param.__qualname__ = name
    param.__doc__ = f"The parameter of this case (``{name}``)."
    return pytest.fixture(name=name)(param)


def _case_fixture(kind: ReportKind) -> Callable[..., object]:
    """A report kind's case fixture: :meth:`~harness.plugin.kinds.ReportKind.case` of the case's parameter."""
    assert kind.fixture is not None
    param_name = kind.param_fixture

    def case(request: pytest.FixtureRequest, **params: object) -> object:
        param = params[param_name] if param_name is not None else None
        return active_run(request.config).report_case(request, kind, param)

    case.__name__ = case.__qualname__ = kind.fixture
    case.__doc__ = (inspect.getdoc(kind.case) or "") + f" (report kind ``{kind.name}``)"
    names = ["request"] + ([param_name] if param_name is not None else [])
    case.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    return pytest.fixture(name=kind.fixture)(case)


# every report kind's fixtures, by name, as module attributes (where pytest finds a plugin's fixtures)
for _kind in REPORT_KINDS:
    if _kind.param_fixture is not None:
        globals()[_kind.param_fixture] = _param_fixture(_kind.param_fixture)
    if _kind.fixture is not None:
        globals()[_kind.fixture] = _case_fixture(_kind)
