"""pytest plugin (entry point ``fidelity``): options, markers, fixtures; the rest is :class:`FidelityRun`.

The plugin stays in its lane. In a project without a fidelity configuration (no ``--fidelity-config``,
no ``.toml`` argument, no ``<rootdir>/fidelity.toml``) it only adds its options and its own markers
(and, on a ``--dist loadgroup`` worker, keeps ``xdist_group`` marks working: :func:`pytest_collection_finish`):
it creates no run, collects, skips and reports nothing. With a configuration, one
:class:`harness.plugin.run.FidelityRun` holds the plan, the session, the adaptive monitor and the
reporter, and implements the hooks. Nothing heavy (torch, transformers) is imported until a
fidelity case runs, so ``pytest --help`` stays fast.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from harness.errors import FidelityError
from harness.plugin import kind_allocate, kind_attribution, kind_paired, kind_precision_floor, kind_tails, kind_window
from harness.plugin.ini import IniKey, add_ini, apply_ini
from harness.plugin.plan import PARAMETRIZED
from harness.plugin.registry import REPORT_KINDS
from harness.plugin.run import RUN_KEY, FidelityRun, active_run
from harness.run.cluster.ray_executor import executor_argument
from harness.scoring.backends import device_argument

if TYPE_CHECKING:
    from harness.allocation.records import AllocationDoc
    from harness.gate.gate import Gate
    from harness.inputs.config import PairConfig
    from harness.plugin.kind_paired import PairCase
    from harness.plugin.kind_tails import TailCase
    from harness.plugin.kind_window import WindowCase, WindowParam
    from harness.run.precision_floor import PrecisionFloor
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
        "threads (default: the free cores = cores minus the load: the one-minute load average, or the tasks runnable "
        "now where fewer; at least 1; under -n W each worker gets free cores // W)",
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
    group.addoption("--fidelity-no-floor", dest="fidelity_no_floor", action="store_true",
                    help="do not measure (or read from the cache) the reference's precision floor shown beside the "
                         "ladder (a float64 forward of the reference on the run's shards: docs/statistics.md)")
    group.addoption("--fidelity-no-score-cache", dest="fidelity_no_score_cache", action="store_true",
                    help="score and summarize every candidate x shard: neither read nor keep scored positions and "
                         "summaries in <cache_dir>/scores/ and summaries/ (as [settings] score_cache = false; "
                         "captures are still cached)")
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


#: ``fidelity_config``: read by :func:`harness.plugin.plan.config_path` (after a ``.toml`` argument, before
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
    """Markers, ini keys and the run. A refusal before the run is the project's error class (a
    :class:`~harness.errors.UsageError`, a :class:`~harness.errors.MissingPackageError`, a configuration
    error); pytest shows its own usage error as one ``ERROR:`` line (exit status 4), so it is raised as that."""
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    try:
        apply_ini(config, OPTION_KEYS)  # before anything reads an option
        run = FidelityRun.configure(config)
    except FidelityError as exc:
        raise pytest.UsageError(str(exc)) from exc
    if run is not None:
        config.stash[RUN_KEY] = run
        config.pluginmanager.register(run, "fidelity-run")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if RUN_KEY not in metafunc.config.stash and any(f in metafunc.fixturenames for f in PARAMETRIZED):
        active_run(metafunc.config)  # fails: a fidelity case without a configuration


# ---------------------------------------------------------------- pytest-xdist's --dist loadgroup
def xdist_group_suffix(item: pytest.Item) -> str | None:
    """``@<names>`` as pytest-xdist forms it from an item's ``xdist_group`` marks (sorted, joined by ``_``), or None."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "@" + "_".join(sorted(names)) if names else None


@pytest.hookimpl(wrapper=True)
def pytest_collection_finish(session: pytest.Session) -> Generator[None, object, object]:
    """``--dist loadgroup`` as pytest-xdist documents it (a candidate's cases on one worker, :mod:`harness.plugin.plan`).

    xdist groups the tests marked ``xdist_group(name)`` by appending ``@name`` to each item's node id on the worker
    (``item._nodeid``); the controller's scheduler reads the group from the node ids a worker sends when its
    collection finishes. From pytest 9.2 an item's ``nodeid`` is ``str(item._id)``, so that assignment is lost and
    every test is a group of its own. Here, on a worker of a ``--dist loadgroup`` run, the grouped items carry their
    ``@group`` node id while the collection is announced, and their own again afterwards: only the scheduler sees
    the suffix (reports, ``-k``, junit names and the commands the plugin writes keep the plain node ids). Where
    xdist's suffix takes effect (a pytest before 9.2), the items already carry it and nothing changes."""
    changed = []
    # on a worker, xdist keeps ``--dist loadgroup`` as the option ``loadgroup`` (its ``dist`` is "no" there)
    if hasattr(session.config, "workerinput") and session.config.getoption("loadgroup", False):
        try:
            from _pytest.nodeid import NodeId
        except ImportError:  # a pytest before 9.2: xdist's own suffix is in the node id
            pass
        else:
            for item in session.items:
                suffix = xdist_group_suffix(item)
                if suffix is not None and not item.nodeid.endswith(suffix):
                    changed.append((item, item._id))
                    item._id = NodeId.parse(item.nodeid + suffix)
    try:
        return (yield)
    finally:
        for item, own in changed:
            item._id = own


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
def fidelity_gate(request: pytest.FixtureRequest) -> Gate:
    """Checks a scored case against its committed baseline (or records it for an update)."""
    return active_run(request.config).gate()


# ---------------------------------------------------------------- report kinds' fixtures
# One parameter fixture (its value is the case's parameter, from the kind's ``params(plan)``) and one case
# fixture (``KIND.case(run, request, param)``) per report kind that has them; tests/test_report_kinds.py checks
# that these are exactly the names the kinds of harness.plugin.registry declare.
#
#   kind (module)              parameter fixture          case fixture
#   tails (kind_tails)         fidelity_tail_candidate    fidelity_tails
#   window (kind_window)       fidelity_window_k          fidelity_window
#   paired (kind_paired)       fidelity_pair              fidelity_paired
#   attribution                -                          fidelity_attribution
#   allocation (kind_allocate) -                          fidelity_allocation
#   precision_floor            -                          fidelity_precision_floor
@pytest.fixture
def fidelity_tail_candidate(request: pytest.FixtureRequest) -> str:
    """The candidate of this tails case (``tails-<candidate>``)."""
    return str(request.param)


@pytest.fixture
def fidelity_tails(request: pytest.FixtureRequest, fidelity_tail_candidate: str) -> TailCase:
    """A candidate's tail report over the selected shards (report kind ``tails``)."""
    return kind_tails.KIND.case(active_run(request.config), request, fidelity_tail_candidate)


@pytest.fixture
def fidelity_window_k(request: pytest.FixtureRequest) -> WindowParam:
    """The first scored row ``k`` of this window case, and the notes on the windows skipped."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def fidelity_window(request: pytest.FixtureRequest, fidelity_window_k: WindowParam) -> WindowCase:
    """Every selected candidate rescored from row ``k`` (report kind ``window``)."""
    return kind_window.KIND.case(active_run(request.config), request, fidelity_window_k)


@pytest.fixture
def fidelity_pair(request: pytest.FixtureRequest) -> PairConfig:
    """The declared pair of this case (``pair-<a>-vs-<b>``)."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def fidelity_paired(request: pytest.FixtureRequest, fidelity_pair: PairConfig) -> PairCase:
    """A declared pair compared on the same positions (report kind ``paired``)."""
    return kind_paired.KIND.case(active_run(request.config), request, fidelity_pair)


@pytest.fixture
def fidelity_attribution(request: pytest.FixtureRequest) -> dict[str, Any]:  # Any: attribute()'s JSON document
    """The ``fidelity_attribute`` marker's attribution of a candidate (report kind ``attribution``)."""
    return kind_attribution.KIND.case(active_run(request.config), request, None)


@pytest.fixture
def fidelity_allocation(request: pytest.FixtureRequest) -> AllocationDoc:
    """The ``fidelity_allocate`` marker's search, built and checked (report kind ``allocation``)."""
    return kind_allocate.KIND.case(active_run(request.config), request, None)


@pytest.fixture
def fidelity_precision_floor(request: pytest.FixtureRequest) -> PrecisionFloor:
    """The reference measured against a higher-precision forward of itself (report kind ``precision_floor``)."""
    return kind_precision_floor.KIND.case(active_run(request.config), request, None)
