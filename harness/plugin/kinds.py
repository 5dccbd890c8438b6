"""What a report kind is: one class behind :class:`ReportKind`, listed once in :mod:`harness.plugin.registry`.

Reasoning: docs/design.md §"Report kinds".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    import pytest
    from _pytest.mark.structures import ParameterSet

    from harness.gate.adaptive import AdaptiveMonitor
    from harness.inputs.config import FidelityConfig
    from harness.run.session import FidelitySession

#: A report-case payload as it is sent: a JSON-ready record that travels home with the test report (each
#: kind's own TypedDict, :attr:`ReportKind.payload`).
Payload = Mapping[str, object]

#: The payload record of a kind whose payloads are checked by their own reader (or never sent): a JSON object.
JSONDoc = dict[str, object]

_T = TypeVar("_T")
#: A kind's payload record (a TypedDict).
P = TypeVar("P")


class CasePlan(Protocol):
    """What a kind reads of the run's plan (:class:`harness.plugin.plan.FidelityPlan`)."""

    @property
    def config(self) -> FidelityConfig:
        """The configuration with only the selected candidates (and pairs of them)."""
        ...

    @property
    def shards(self) -> tuple[int, ...]:
        """The selected shards."""
        ...

    @property
    def case_names(self) -> tuple[str, ...]:
        """Every selected candidate name, in file order."""
        ...

    @property
    def selector(self) -> tuple[str, ...]:
        """Command-line words that select this configuration (in an update or reproduce command)."""
        ...

    @property
    def n_ctx(self) -> int:
        """Tokens per context of the suite."""
        ...

    def param(self, value: object, case_id: str, candidate: str) -> ParameterSet:
        """A parameter of a case that measures ``candidate`` (its xdist group; skipped when its engine is missing)."""
        ...


class CaseRun(Protocol):
    """What a kind's case uses of the run (:class:`harness.plugin.run.FidelityRun`)."""

    @property
    def plan(self) -> CasePlan:
        """The run's plan."""
        ...

    @property
    def session(self) -> FidelitySession:
        """The run's session: suite, head, reference, each candidate's scored positions."""
        ...

    @property
    def monitor(self) -> AdaptiveMonitor | None:
        """The adaptive monitor (``--fidelity-adaptive``), or None."""
        ...

    def compute(self, what: str, fn: Callable[[], _T]) -> _T:
        """``fn()``; a FidelityError fails the case with one line ``what: message``."""
        ...

    def send(self, request: pytest.FixtureRequest, kind: str, data: Payload) -> None:
        """Queue a payload of ``kind`` to travel home with this test's report."""
        ...


class ReportCase(Protocol):
    """The value of a kind's case fixture: its payload and its check."""

    @property
    def payload(self) -> Payload:
        """What the case sends home (its kind's payload record)."""
        ...

    def check(self) -> None:
        """Raise ``AssertionError`` with a readable message when the report fails its rule."""
        ...


class Uncollected:
    """Defaults for a kind with no case function of its own (its payloads are sent by other cases, or its
    fixture serves a user's test): no parameters, no parametrized fixture, nothing collected from the
    configuration file. A subclass sets ``name``, ``marker``, ``marker_doc``, ``fixture`` and its writer."""

    param_fixture: str | None = None
    fixture: str | None = None
    test: str | None = None
    test_doc = ""

    def params(self, plan: CasePlan) -> list[ParameterSet]:
        return []


@dataclass
class Written:
    """What a kind's writer wrote: the files, and the lines shown under "fidelity reports"."""

    files: list[Path] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


class ReportKind(Protocol[P]):
    """One report kind (docs/design.md §"Report kinds"); ``P``: its payload record, what :meth:`case` sends home and
    :meth:`write` reads."""

    @property
    def name(self) -> str:
        """The payload kind: the key its payloads are gathered under, and its name in messages."""
        ...

    @property
    def payload(self) -> type[P]:
        """The payload's record (a TypedDict): a payload arriving from a worker is checked against it
        (:func:`harness.io.schema.checked`) before :meth:`write` reads it."""
        ...

    @property
    def marker(self) -> str | None:
        """Its pytest marker (``-m NAME``), or None."""
        ...

    @property
    def marker_doc(self) -> str:
        """The marker's description (``pytest --markers``)."""
        ...

    @property
    def param_fixture(self) -> str | None:
        """The fixture parametrized with ``params(plan)`` (its value is the parameter), or None."""
        ...

    @property
    def fixture(self) -> str | None:
        """The fixture whose value is the case (:meth:`case`), or None."""
        ...

    @property
    def test(self) -> str | None:
        """The case function collected from a ``fidelity.toml`` (``fidelity.toml::test_<kind>[...]``), or None."""
        ...

    @property
    def test_doc(self) -> str:
        """The case function's docstring (what the case asserts)."""
        ...

    def params(self, plan: CasePlan) -> list[ParameterSet]:
        """One pytest parameter per case of this run (empty: the kind is not collected)."""
        ...

    def case(self, run: CaseRun, request: pytest.FixtureRequest, param: object) -> object:
        """The case fixture's value for ``param`` (one of :meth:`params`; computed from the session; queues its
        payload home)."""
        ...

    def write(self, out: Path, payloads: Sequence[P], palette_names: Sequence[str] | None) -> Written:
        """Controller side: write the run's artifacts of this kind from every case's payload."""
        ...
