"""The case functions the plugin collects from a ``fidelity.toml`` (``pytest my.toml``, or any run with a configuration).

They are collected under the configuration file's node (``fidelity.toml::test_fidelity[int8-shard00]``),
so a user's own folder needs nothing but the file; this repository's ladder is collected the same way.
The fixtures they use come from :mod:`harness.plugin.pytest_plugin` and do the work through
:class:`harness.plugin.run.FidelityRun`.

========================= ======================= =============================================
function                  marker                  one case per
========================= ======================= =============================================
``test_fidelity``         ``fidelity``            candidate x shard (``<candidate>-shard<NN>``)
``test_tails``            ``fidelity_tails``      candidate (``tails-<candidate>``)
``test_window``           ``fidelity_window``     window ``k`` (``window-from<k>``)
``test_paired``           ``fidelity_paired``     declared pair (``pair-<a>-vs-<b>``)
========================= ======================= =============================================
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.fidelity
def test_fidelity(fidelity_scored: Any, fidelity_gate: Any) -> None:
    """The candidate's drift on this shard stays within its committed thresholds."""
    failure = fidelity_gate.failure(fidelity_scored)
    if failure:
        pytest.fail(failure, pytrace=False)


def _check(case: Any, hint: str = "", hint_when: str = "") -> None:
    """A report case's check as one readable failure (its message, never a traceback or the case's repr);
    ``hint`` is appended when the message contains ``hint_when``."""
    try:
        case.check()
    except AssertionError as e:
        text = str(e)
        pytest.fail(text + (f"\n{hint}" if hint and hint_when in text else ""), pytrace=False)


@pytest.mark.fidelity_tails
def test_tails(fidelity_tails: Any, fidelity_gate: Any) -> None:
    """Cumulative exceedances equal the shards' sum, pooled percentiles lie in their histogram brackets,
    the pooled max is the shards' max, and the pooled p99 is not certainly above the baseline's ``max_p99``."""
    from harness.gate.gate import update_command

    name = str(fidelity_tails.payload.get("candidate", ""))
    _check(fidelity_tails, f"if this p99 change is intended, update the baseline with: "
                           f"{update_command(name, fidelity_gate.selector)}", hint_when="max_p99 of its baseline")


@pytest.mark.fidelity_window
def test_window(fidelity_window: Any) -> None:
    """The same positions summarized from row k: n_positions follows the window arithmetic, and two
    candidates with disjoint intervals never swap places (flips within overlapping intervals warn)."""
    _check(fidelity_window)


@pytest.mark.fidelity_paired
def test_paired(fidelity_paired: Any) -> None:
    """Common-random-number comparison of a declared pair; fails on a verdict other than its ``expect``."""
    _check(fidelity_paired)
