"""Report kind ``cross_engine``: the floor matrix and the candidates net of their engine's floor (sent by
``fidelity_tests/test_cross_engine.py``, marked ``fidelity_cross_engine``), printed in full.

Artifacts: ``cross_engine.json``, ``cross_engine.md`` (:mod:`harness.run.cross_engine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.plugin.kinds import CaseRun, JSONDoc, Uncollected, Written
from harness.run.cross_engine import from_json_dict, matrix_lines, net_lines, write_cross_engine

if TYPE_CHECKING:
    import pytest


class CrossEngine(Uncollected):
    """The same bf16 weights through every engine: each engine's floor, and each candidate net of it."""

    name = "cross_engine"
    #: checked by its own reader (harness.run.cross_engine.from_json_dict)
    payload: type[JSONDoc] = dict
    marker = "fidelity_cross_engine"
    marker_doc = "fidelity cross-engine floor (same weights, two engines)"

    def case(self, run: CaseRun, request: pytest.FixtureRequest, param: object) -> None:
        raise NotImplementedError("the cross-engine floor is sent by fidelity_tests/test_cross_engine.py")

    def write(self, out: Path, payloads: Sequence[JSONDoc], palette_names: Sequence[str] | None) -> Written:
        written = Written()
        for doc in payloads:
            matrix, rows = from_json_dict(doc)
            md, js = write_cross_engine(out, matrix, rows)
            written.files += [md, js]
            written.lines += matrix_lines(matrix) + [""] + net_lines(matrix, rows) + ["", f"cross-engine: {md}, {js}"]
        return written


KIND = CrossEngine()
