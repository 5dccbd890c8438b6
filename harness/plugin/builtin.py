"""The case functions the plugin collects from a ``fidelity.toml`` (``pytest my.toml``, or any run with a configuration).

They are collected under the configuration file's node (``fidelity.toml::test_fidelity[int8-shard00]``),
so a user's own folder needs nothing but the file; this repository's ladder is collected the same way.
The fixtures they use come from :mod:`harness.plugin.pytest_plugin` and do the work through
:class:`harness.plugin.run.FidelityRun`.

``test_fidelity`` (marker ``fidelity``) is one case per candidate x shard (``<candidate>-shard<NN>``);
each report kind of :mod:`harness.plugin.registry` with a ``test`` adds its function here (marker, one case
per parameter): ``test_tails`` (``tails-<candidate>``), ``test_window`` (``window-from<k>``),
``test_paired`` (``pair-<a>-vs-<b>``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from harness.plugin.kinds import ReportKind
from harness.plugin.registry import REPORT_KINDS

#: The skip reason of a case of a first run (no baseline recorded yet for any candidate).
NO_BASELINE_SKIP = "no baseline for any candidate yet (a first run): scored and reported, not gated"


@pytest.mark.fidelity
def test_fidelity(fidelity_scored: Any, fidelity_gate: Any) -> None:
    """The candidate's drift on this shard stays within its committed thresholds."""
    if fidelity_gate.fresh():  # a first run: the ladder and one "no baselines yet" line, not a failure per case
        pytest.skip(NO_BASELINE_SKIP)
    failure = fidelity_gate.failure(fidelity_scored)
    if failure:
        pytest.fail(failure, pytrace=False)


def _case_function(kind: ReportKind) -> Callable[..., None]:
    """``kind``'s case function: it takes the kind's case fixture and runs its check; a failed check fails the
    case with its message only (no traceback, no repr of the case)."""
    assert kind.test is not None and kind.fixture is not None and kind.marker is not None
    fixture = kind.fixture

    def case(**fixtures: Any) -> None:
        try:
            fixtures[fixture].check()
        except AssertionError as e:
            pytest.fail(str(e), pytrace=False)

    case.__name__ = case.__qualname__ = kind.test
    case.__doc__ = kind.test_doc
    case.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(fixture, inspect.Parameter.KEYWORD_ONLY)])
    marked: Callable[..., None] = getattr(pytest.mark, kind.marker)(case)
    return marked


for _kind in REPORT_KINDS:
    if _kind.test is not None:
        globals()[_kind.test] = _case_function(_kind)
