"""Attribution cases (``pytest fidelity_tests -m fidelity_attribute``; slow: one capture per tensor group).

The marker names a configured candidate; the fixture writes ``fidelity-reports/attribution/<candidate>/``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.fidelity_attribute(candidate="int4_g32", by="layer", shards="0", modes="restore")
def test_int4_drift_by_layer(fidelity_attribution: dict[str, Any]) -> None:
    """Every layer's ΔKLD is resolved above zero and the effects explain the whole within 20%."""
    (g,) = fidelity_attribution["groupings"]
    assert all(r["restore"]["ci95"][0] > 0 for r in g["groups"])
    assert 0.8 < g["additivity"]["explained_restore"] < 1.2
