"""The precision floor of the configured reference (``pytest fidelity.toml -m fidelity_precision_floor``; slow).

The fixture writes ``<report dir>/precision_floor.json`` and ``.md``; the ladder of the same run shows it.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.fidelity_precision_floor(shards="0", dtype="float64")
def test_reference_precision_floor(fidelity_precision_floor: dict[str, Any]) -> None:
    """The bf16 capture differs from a float64 forward of its own weights by a resolved, small KLD."""
    k = fidelity_precision_floor["kld"]
    assert k["ci95"] is not None and 0 < k["ci95"][0] <= k["mean"] <= k["ci95"][1]
    assert k["mean"] < 1e-3
