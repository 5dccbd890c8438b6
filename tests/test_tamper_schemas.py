"""One strict reader, one schema per file: summaries that lie are refused by name, a non-UTF-8
``checksums.txt`` is a named problem, shard report blocks are checked by their schema.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.errors import VerificationError

# ----------------------------------------------------------------------------- 6. one strict reader, one schema per file


def _tail(**over: Any) -> dict[str, Any]:
    """A tail report of the shape ``tails.json`` holds (numbers arbitrary: only the schema is read here)."""
    stats = {"n_positions": 4, "percentiles": {"p50": 0.1, "p90": 0.2, "p99": 0.3, "p99.9": 0.3}, "cvar1": 0.3, "max": 0.3,
             "exceedance": {"0.0001": 4}}
    rep = {"schema": "fidelity.tails/1", "candidate": "a", "score_from": 0, "shards": [{"shard": 0, **stats}],
           "cumulative": {**stats, "quantile_bounds": {k: [0.0, 1.0] for k in ("p50", "p90", "p99", "p99.9")},
                          "exceedance_histogram_bounds": {"0.0001": [4, 4]}},
           "ccdf": {"x": [1e-3], "y": [0.5]}}
    return {**rep, **over}


@pytest.mark.parametrize("doc, pattern", [
    ({"schema": "fidelity.tails/1", "candidates": "x"},
     r"tails\.json: candidates: expected an array of an object \{schema, candidate, .*\} \(no other key\), found a string 'x'"),
    ({"schema": "fidelity.tails/1", "candidates": [_tail(ccdf={"x": [1e-3], "y": ["0.5"]})]},
     r"tails\.json: candidates\[0\]\.ccdf\.y\[0\]: expected a finite number, found a string '0\.5'"),
    ({"schema": "fidelity.tails/1", "candidates": [{k: v for k, v in _tail().items() if k != "cumulative"}]},
     r"tails\.json: candidates\[0\]\.cumulative: expected present, found missing"),
])
def test_publish_refuses_a_lying_summary_by_name(tmp_path: Path, doc: Any, pattern: str) -> None:
    from harness.reports.report_set import TAILS_SCHEMA, _read_json

    (tmp_path / "tails.json").write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=pattern):
        _read_json(tmp_path / "tails.json", TAILS_SCHEMA)
    (tmp_path / "tails.json").write_bytes(b'{"candidates": "\xff"}')
    with pytest.raises(VerificationError, match=r"tails\.json: encoding: expected UTF-8 JSON"):
        _read_json(tmp_path / "tails.json", TAILS_SCHEMA)


def test_checksums_not_utf8_is_a_named_problem(tmp_path: Path) -> None:
    from harness.reports.report_set import verify_set

    (tmp_path / "checksums.txt").write_bytes(b"\xff\xfe not text")
    assert verify_set(tmp_path) == [f"{tmp_path / 'checksums.txt'}: encoding: expected UTF-8 text, found byte 0: invalid start byte"]


def test_shard_report_blocks_are_checked_by_schema(tmp_path: Path) -> None:
    """A shard report missing a block consumers add up (``metrics.totals.histogram``), or with a string where
    a count belongs, is refused naming the file and the dotted key (aggregate never meets a bare KeyError)."""
    from harness.io.schema import Nullable, Optional, check

    schema = {"totals": {"n": int, "histogram": {"counts": [int]}, "extra": Optional({"k": float})}, "ci": Nullable([float])}
    good = {"totals": {"n": 3, "histogram": {"counts": [1, 2]}}, "ci": None}
    check(good, schema, "r.json", "metrics")
    for bad, pattern in [({"totals": {"n": 3}, "ci": None}, r"r\.json: metrics\.totals\.histogram: expected present, found missing"),
                         ({"totals": {"n": True, "histogram": {"counts": []}}, "ci": None}, r"metrics\.totals\.n: expected an integer, found true/false True"),
                         ({"totals": {"n": 3, "histogram": {"counts": [1, "2"]}}, "ci": None}, r"histogram\.counts\[1\]: expected an integer, found a string '2'"),
                         ({**good, "totals": {**good["totals"], "extra": {"k": "nan"}}}, r"metrics\.totals\.extra\.k: expected a finite number"),
                         ({**good, "ci": [0.1, None]}, r"metrics\.ci\[1\]: expected a finite number, found null None")]:
        with pytest.raises(VerificationError, match=pattern):
            check(bad, schema, "r.json", "metrics")
