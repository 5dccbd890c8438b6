"""Suite and plan honesty: a suite that repeats a window is refused; a plan search never reports its cap
as the answer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.errors import VerificationError

# ----------------------------------------------------------------------------- 8. suite and plan honesty


def test_suite_with_a_duplicated_window_is_refused(tmp_path: Path, tiny_suite: Path) -> None:
    """A context that repeats another's window (same document, same start), resealed, fails verification
    naming both contexts: it would be scored and bootstrapped twice."""
    from harness.inputs.suite import Suite, manifest_sha256

    shutil.copytree(tiny_suite, tmp_path / "s")
    sj = tmp_path / "s" / "suite.json"
    doc = json.loads(sj.read_text())
    doc["contexts"][3]["document"] = doc["contexts"][2]["document"]
    doc["contexts"][3]["start_token"] = doc["contexts"][2]["start_token"]
    doc["manifest_sha256"] = manifest_sha256(doc)
    sj.write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=r"suite\.json: contexts\[3\] \(document, start_token\): expected each "
                                                r"window of a document once, found .* already contexts\[2\]"):
        Suite.load(tmp_path / "s")


def test_plan_search_never_reports_its_cap_as_the_answer() -> None:
    """A requirement beyond the search cap is None ("more than"), and one just below the cap is found exactly
    (checked against the closed form of the normal-approximation bound with a huge pilot spread)."""
    from harness.planning.design import MAX_CLUSTERS, ClusterPilot, _smallest, clusters_for_precision

    rng = np.random.default_rng(0)
    n = np.full(20, 100.0)
    p = ClusterPilot(sums=rng.normal(1.0, 50.0, 20) * 100.0 + 100.0, positions=n, contexts=np.ones(20))
    assert clusters_for_precision(p, 1e-300) is None
    assert _smallest(lambda c: c >= MAX_CLUSTERS - 3) == MAX_CLUSTERS - 3
    assert _smallest(lambda c: c >= MAX_CLUSTERS) == MAX_CLUSTERS
    assert _smallest(lambda c: c >= 9_000_001) == 9_000_001  # between the last doubling (8,388,608) and the cap
