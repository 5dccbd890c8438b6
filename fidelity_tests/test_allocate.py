"""Layout search as a gate (``pytest fidelity_tests -m fidelity_allocate``; slow: a search on shard 0, two builds, six captures on the held-out shards 1-3).

The marker searches a layout for the budget (effects measured on shard 0), builds it and the uniform layout whose
bytes set the budget, scores both as ordinary candidates (here on shards 1-3, which the search did not see), and
fails unless the proposal is no worse on the same positions (with ``expect="better"``: unless it is better, its
paired interval below zero).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.allocation.records import AllocationDoc
from harness.io.hashing import sha256_file
from harness.io.schema import check, schema_of
from harness.reports.report_dir import STAMP, check_ledger

pytestmark = pytest.mark.slow


@pytest.mark.fidelity_allocate(base="int4_g32", budget="int4_g32", choices="int3_g32,int4_g32,int5_g32", by="layer",
                               check_shards="1-3",
                               expect="better")
def test_int4_budget_spent_better(fidelity_allocation: AllocationDoc, request: pytest.FixtureRequest) -> None:
    """At int4_g32's bytes the layout beats uniform int4_g32, and its built bytes are the predicted bytes; the
    check's shard reports and ladder are a report folder whose ledger lists every one of them."""
    check(fidelity_allocation, schema_of(AllocationDoc), "fidelity_allocation")  # the declared record, check included
    (p,) = fidelity_allocation["check"]["proposals"]
    assert p["built_bytes"] == p["predicted_bytes"] <= p["budget_bytes"]
    assert abs(p["on_disk_bytes"] / p["comparator"]["on_disk_bytes"] - 1) < 0.02
    assert p["comparator"]["paired"]["ci95"][1] < 0
    reports = Path(request.config.getoption("fidelity_report_dir")) / "allocation" / request.node.name / "check" / "reports"
    ledger = check_ledger(reports)
    assert ledger is not None
    on_disk = {f.relative_to(reports).as_posix(): sha256_file(f) for f in reports.rglob("*") if f.is_file() and f.name != STAMP}
    assert {rel: e["sha256"] for rel, e in ledger["files"].items()} == on_disk
    assert len(on_disk) == 2 + 2 * 3 * len(fidelity_allocation["check"]["candidates"])  # ladder + 3 shards a candidate
    assert {r["command"] for r in ledger["runs"].values()} == {f"pytest {request.node.nodeid}"}
