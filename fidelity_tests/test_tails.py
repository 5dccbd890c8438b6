"""Tail reports (``pytest -m tails``): one case per candidate, over the selected shards.

Each case checks that the cumulative exceedance counts equal the sum over the shards, that the
exact pooled percentiles lie inside their histogram brackets, that the pooled max is the shards'
max, and (when the candidate's baseline has ``max_p99``) that the pooled p99 is not certainly above
it. The controller writes ``tails.md``, ``tails.json`` and ``tails.png`` into the report dir.
"""

import pytest

pytestmark = pytest.mark.tails


def test_tails(fidelity_tails):
    fidelity_tails.check()
