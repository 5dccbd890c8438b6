"""Scoring-window controls (``pytest -m window``): the same positions summarized from row k.

Each case (k in 0, 64, n_ctx/2; windows past n_ctx-2 are skipped with a note) checks the window
arithmetic of n_positions and fails when two candidates with disjoint intervals swap places
(flips within overlapping intervals only warn). The controller writes ``window.md`` and
``window.json`` with each candidate's relative change and the verdict line.
"""

import pytest

pytestmark = pytest.mark.window


def test_window(fidelity_window):
    fidelity_window.check()
