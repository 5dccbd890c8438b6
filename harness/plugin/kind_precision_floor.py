"""Report kind ``precision_floor``: a test marked ``@pytest.mark.fidelity_precision_floor(shards=None,
dtype='float64')`` that asks for the ``fidelity_precision_floor`` fixture gets the configured reference
capture measured against a higher-precision forward of its own weights
(:func:`harness.run.precision_floor.precision_floor`).

Artifacts: ``precision_floor.json`` and ``.md`` in the report folder, written by the fixture itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.plugin.kinds import CaseRun, JSONDoc, Uncollected, Written
from harness.run.precision_floor import PrecisionFloor as PrecisionFloorRecord
from harness.run.precision_floor import precision_floor, write_precision_floor

if TYPE_CHECKING:
    import pytest


class PrecisionFloor(Uncollected):
    """The reference capture against a higher-precision forward of the same weights."""

    name = "precision_floor"
    #: never sent: the fixture writes its own files
    payload: type[JSONDoc] = dict
    marker = "fidelity_precision_floor"
    marker_doc = ("fidelity_precision_floor(shards=None, dtype='float64'): the reference capture against a "
                  "higher-precision forward of its own weights (fixture fidelity_precision_floor)")
    fixture = "fidelity_precision_floor"

    def case(self, run: CaseRun, request: pytest.FixtureRequest, param: object) -> PrecisionFloorRecord:
        """The marker's measurement of the configured reference; written to ``<report dir>/precision_floor.json``
        and ``.md``."""
        import pytest

        mark = request.node.get_closest_marker(self.marker)
        kw = dict(mark.kwargs) if mark is not None else {}
        cfg = run.plan.config
        model = cfg.reference.model
        if model is None:
            pytest.fail("the precision floor needs reference.model in the configuration", pytrace=False)
        # a refused reference (store, head, suite) fails the test naming the refusal, never a verdict over nothing
        result = run.compute("precision floor", lambda: precision_floor(
            suite_path=cfg.suite, model_dir=model, store_path=cfg.reference.store,
            head_path=cfg.reference.head, n_boot=cfg.n_boot, **kw))
        write_precision_floor(result, Path(request.config.getoption("fidelity_report_dir")))
        return result

    def write(self, out: Path, payloads: Sequence[JSONDoc], palette_names: Sequence[str] | None) -> Written:
        return Written()


KIND = PrecisionFloor()
