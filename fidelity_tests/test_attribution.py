"""Attribution cases (``pytest fidelity_tests -m fidelity_attribute``; slow: one capture per tensor group).

The marker names a configured candidate; the fixture writes ``fidelity-reports/attribution/<candidate>/``.
The case checks the attribution's numbers against an independent computation: float64 forwards of the
weight-swapped variants (``fixtures/kld_by_hand.py``), on the same shard's contexts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.fidelity_attribute(candidate="int4_g32", by="layer", shards="0", modes="restore")
def test_int4_drift_by_layer(fidelity_attribution: dict[str, Any]) -> None:
    """The whole KLD and every layer's ΔKLD equal those of float64 forwards (within the attribution's float32
    compute: 1e-3 of the value + 1e-5 of the whole), and the layers rank in the by-hand order."""
    sys.path.insert(0, str(ROOT / "fixtures"))
    from kld_by_hand import ByHand

    from harness.inputs.suite import Suite

    res = fidelity_attribution
    suite = Suite.load(Path(res["suite"]["path"]))
    tokens = np.asarray(suite.tokens[suite.context_indices(res["suite"]["shards"])])
    bh = ByHand(Path(res["reference"]["path"]), Path(res["candidate"]["path"]), tokens)
    (g,) = res["groupings"]
    whole, effects = bh.restore_effects({r["group"]: r["params"] for r in g["groups"]})
    tol = 1e-5 * whole
    assert abs(res["whole"]["value"] - whole) <= 1e-3 * whole + tol, (res["whole"]["value"], whole)
    for r in g["groups"]:
        want = effects[r["group"]]
        assert abs(r["restore"]["value"] - want) <= 1e-3 * abs(want) + tol, (r["group"], r["restore"]["value"], want)
    assert [r["group"] for r in g["groups"]] == sorted(effects, key=lambda k: -effects[k])
