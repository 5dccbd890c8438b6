"""Paired comparisons (``pytest -m paired``): one case per ``[[pairs]]`` entry of fidelity.toml.

Common-random-number cluster bootstrap of a - b for mean KLD, p99, CVaR1%, top-1 and EAR; the
verdict (equivalent / A better / B better / inconclusive) uses the pair's margin. A pair that
declares ``expect`` fails on any other verdict. The controller writes ``paired/<a>-vs-<b>.json``
and ``.md``.
"""

import pytest

pytestmark = pytest.mark.paired


def test_paired(fidelity_paired):
    fidelity_paired.check()
