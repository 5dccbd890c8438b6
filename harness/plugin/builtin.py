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

from typing import TYPE_CHECKING

import pytest

from harness.plugin import kind_paired, kind_tails, kind_window

if TYPE_CHECKING:
    from harness.gate.gate import Gate
    from harness.plugin.kind_paired import PairCase
    from harness.plugin.kind_tails import TailCase
    from harness.plugin.kind_window import WindowCase
    from harness.plugin.kinds import ReportCase
    from harness.run.session import ScoredShard

#: The skip reason of a case of a first run (no baseline recorded yet for any candidate).
NO_BASELINE_SKIP = "no baseline for any candidate yet (a first run): scored and reported, not gated"


@pytest.mark.fidelity
def test_fidelity(fidelity_scored: ScoredShard, fidelity_gate: Gate) -> None:
    """The candidate's drift on this shard stays within its committed thresholds."""
    if fidelity_gate.fresh():  # a first run: the ladder and one "no baselines yet" line, not a failure per case
        pytest.skip(NO_BASELINE_SKIP)
    failure = fidelity_gate.failure(fidelity_scored)
    if failure:
        pytest.fail(failure, pytrace=False)


def _check(case: ReportCase) -> None:
    """Run a report case's check; a failed check fails the case with its message only (no traceback, no repr
    of the case)."""
    __tracebackhide__ = True
    try:
        case.check()
    except AssertionError as e:
        pytest.fail(str(e), pytrace=False)


# One case function per report kind with a ``test`` (tests/test_report_kinds.py checks the names, markers and
# fixtures against harness.plugin.registry); each one's docstring is its kind's rule (``KIND.test_doc``).
@pytest.mark.fidelity_tails
def test_tails(fidelity_tails: TailCase) -> None:
    _check(fidelity_tails)


@pytest.mark.fidelity_window
def test_window(fidelity_window: WindowCase) -> None:
    _check(fidelity_window)


@pytest.mark.fidelity_paired
def test_paired(fidelity_paired: PairCase) -> None:
    _check(fidelity_paired)


test_tails.__doc__ = kind_tails.KIND.test_doc
test_window.__doc__ = kind_window.KIND.test_doc
test_paired.__doc__ = kind_paired.KIND.test_doc
