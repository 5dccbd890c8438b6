"""The plan of a pytest run: which ``fidelity.toml`` it uses and what that file selects.

:func:`config_path` finds the configuration (an option, a ``.toml`` argument, the ini key, the rootdir's
``fidelity.toml``); :class:`FidelityPlan` validates it with the ``--fidelity-shards`` and
``--fidelity-candidates`` selections and parametrizes the cases (:data:`PARAMETRIZED`). The run itself is
:class:`harness.plugin.run.FidelityRun`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.engines.registry import get_engine
from harness.errors import UsageError
from harness.inputs.config import load_config
from harness.inputs.interchange_layout import scan_layout
from harness.inputs.suite import parse_shard_spec
from harness.interchange.suite_manifest import load_any_suite
from harness.plugin.ini import ini_path
from harness.plugin.registry import REPORT_KINDS

if TYPE_CHECKING:
    from _pytest.mark.structures import ParameterSet

    from harness.inputs.config import FidelityConfig


def config_path(config: pytest.Config) -> tuple[Path | None, str]:
    """The ``fidelity.toml`` of this run and how it was named: ``option``, ``argument``, ``ini`` or ``default``.

    ``--fidelity-config PATH`` wins; else a ``.toml`` file given on the command line (``pytest my.toml``);
    else the ini key ``fidelity_config``; else a ``.toml`` among ``testpaths``; else ``<rootdir>/fidelity.toml``
    when it exists; else none (the plugin stays inert).
    """
    opt = config.getoption("fidelity_config")
    if opt:
        return Path(config.invocation_params.dir, opt).resolve(), "option"
    tomls = [p for p in collected_paths(config) if p.suffix == ".toml" and p.is_file()]
    if tomls and config.args_source == pytest.Config.ArgsSource.ARGS:
        return tomls[0], "argument"
    ini = ini_path(config, "fidelity_config")
    if ini is not None:
        return ini, "ini"
    if tomls:
        return tomls[0], "argument"
    default = Path(config.rootpath) / "fidelity.toml"
    return (default.resolve(), "default") if default.is_file() else (None, "default")


def collected_paths(config: pytest.Config) -> list[Path]:
    """pytest's positional paths (or its ``testpaths``), resolved."""
    return [Path(config.invocation_params.dir, str(a).split("::")[0]).resolve() for a in config.args]


def shown_path(path: Path, config: pytest.Config) -> str:
    """``path`` as the user would type it from where pytest was started."""
    return os.path.relpath(path, Path(config.invocation_params.dir).resolve())


@dataclass(frozen=True)
class FidelityPlan:
    """What this run measures. ``config`` holds only the selected candidates (and pairs of them);
    ``full`` is the file as written (for baselines no longer in use)."""

    path: Path
    full: FidelityConfig
    config: FidelityConfig
    shards: tuple[int, ...]
    n_ctx: int
    #: ``suite_token_sha256`` of the suite: the report folder is stamped with it (no mixing of suites).
    suite_sha256: str
    #: Command-line words that select this configuration in a reproduce / fix-it command.
    selector: tuple[str, ...]
    #: Every selected candidate name, in file order: the candidate x shard and tail cases.
    case_names: tuple[str, ...] = ()
    #: Selected live candidates whose engine is not installed, ``(name, skip reason)``: their cases skip with the
    #: engine's install command, and they are left out of ``config`` (window and paired cases never need them).
    unavailable: tuple[tuple[str, str], ...] = ()

    @classmethod
    def load(cls, config: pytest.Config, path: Path, how: str) -> FidelityPlan:
        """Validate the file, the shard and candidate selections; a problem is a :class:`~harness.errors.FidelityError`
        (the plugin reports it as a usage error)."""
        full = load_config(path)
        suite = load_any_suite(full.suite, verify=False)  # the published layout is read in place
        spec = config.getoption("fidelity_shards")
        shards = parse_shard_spec(spec, len(suite.shards)) if spec else list(range(len(suite.shards)))
        held = full.reference_shards
        if held is not None:  # a dataset holds the reference of some shards only
            lacking = [k for k in shards if k not in held]
            if spec and lacking:
                raise UsageError(lacking_shards(full, spec, held, lacking))
            shards = [k for k in shards if k in held]
        names = config.getoption("fidelity_candidates")
        chosen = [full.candidate(n) for n in names.split(",")] if names else list(full.candidates)
        case_names = tuple(c.name for c in full.candidates if c.name in {c.name for c in chosen})
        unavailable = unavailable_engines(full, case_names)
        keep = set(case_names) - {name for name, _ in unavailable}
        if config.getoption("fidelity_no_score_cache"):
            full = dataclasses.replace(full, score_cache=False)
        selected = dataclasses.replace(full, candidates=tuple(c for c in full.candidates if c.name in keep),
                                       pairs=tuple(p for p in full.pairs if p.a in keep and p.b in keep))
        # pointing pytest at the file selects it exactly as --fidelity-config does (and collects only its cases)
        selector = (shown_path(path, config),)
        return cls(path, full, selected, tuple(shards), suite.n_ctx, suite.suite_token_sha256, selector,
                   case_names, unavailable)

    # ------------------------------------------------------------ parametrization
    def _marks(self, name: str) -> list[pytest.MarkDecorator]:
        """xdist grouping per candidate, plus a skip naming the install command when its engine is missing."""
        marks = [pytest.mark.xdist_group(name)]
        reason = dict(self.unavailable).get(name)
        if reason is not None:
            marks.append(pytest.mark.skip(reason=reason))
        return marks

    def case_params(self) -> list[ParameterSet]:
        """One case per candidate x selected shard, ids ``<candidate>-shard<NN>``, grouped per candidate for xdist."""
        return [pytest.param((n, s), id=f"{n}-shard{s:02d}", marks=self._marks(n))
                for n in self.case_names for s in self.shards]

    def param(self, value: object, case_id: str, candidate: str) -> ParameterSet:
        """A parameter of a case that measures ``candidate``: grouped per candidate for xdist, skipped (naming the
        install command) when its engine is missing."""
        return pytest.param(value, id=case_id, marks=self._marks(candidate))


#: Fixture name -> how its cases are generated: the candidate x shard cases (``indirect``: the fixture receives
#: ``request.param``), then each report kind's parameter fixture (:mod:`harness.plugin.registry`).
PARAMETRIZED: dict[str, Callable[[FidelityPlan], list[ParameterSet]]] = {
    "fidelity_case": FidelityPlan.case_params,
    **{kind.param_fixture: kind.params for kind in REPORT_KINDS if kind.param_fixture is not None},
}


def unavailable_engines(config: FidelityConfig, names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``(name, skip reason)`` of the live candidates among ``names`` whose engine's package is not installed
    (e.g. engine ``vllm`` on a machine without vLLM). Replayed stores need no engine and are never listed."""
    out = []
    for name in names:
        cand = config.candidate(name)
        if cand.model is None:
            continue
        engine = get_engine(cand.engine, str(config.path))
        if not engine.available():
            out.append((name, f"engine {engine.name!r} is not installed (candidate {name}): "
                               f"install it with: {engine.install_hint}"))
    return tuple(out)


def lacking_shards(full: FidelityConfig, spec: str, held: Sequence[int], lacking: Sequence[int]) -> str:
    """The refusal of ``--fidelity-shards`` naming shards the dataset holds no whole reference for: the file
    that says so and, for the published layout, the capture manifest that lacks each shard's contexts."""
    dataset = Path(str(full.dataset))
    found = f"found {','.join(map(str, lacking))}"
    if full.dataset_layout == "fidelity.dataset/1":
        where = dataset / "dataset.json"
    else:
        where = dataset / "reference"
        gaps = scan_layout(dataset, full.reference.head).gaps
        found += "".join(f" ({gaps[k]})" for k in lacking if k in gaps)
    return (f"{where}: --fidelity-shards {spec}: expected shards the dataset holds a reference for "
            f"({','.join(map(str, held))}), {found}")
