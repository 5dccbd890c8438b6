"""Report kind ``attribution``: a test marked ``@pytest.mark.fidelity_attribute(candidate, ...)`` that asks for
the ``fidelity_attribution`` fixture gets the candidate's drift attributed to tensor groups against the
configured reference model (:func:`harness.attribution.run.attribute`).

Artifacts: ``attribution/<candidate>/`` (:func:`harness.attribution.render.write_attribution`), written by
the fixture itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.attribution.render import write_attribution
from harness.attribution.run import attribute, request_from
from harness.plugin.kinds import CaseRun, JSONDoc, Uncollected, Written

if TYPE_CHECKING:
    import pytest


class Attribution(Uncollected):
    """The candidate's drift attributed to tensor groups (restore / only one group at a time)."""

    name = "attribution"
    #: never sent: the fixture writes its own files
    payload: type[JSONDoc] = dict
    marker = "fidelity_attribute"
    marker_doc = ("fidelity_attribute(candidate, by='layer,kind', shards=None, modes='restore,only', globs=()): "
                  "attribute the candidate's drift to tensor groups (fixture fidelity_attribution)")
    fixture = "fidelity_attribution"

    def case(self, run: CaseRun, request: pytest.FixtureRequest, param: object) -> dict[str, Any]:  # Any: attribute()'s JSON document
        """The marker's attribution of a configured candidate against the configured reference model; written to
        ``<report dir>/attribution/<candidate>/``."""
        import pytest

        mark = request.node.get_closest_marker(self.marker)
        if mark is None or not (mark.args or "candidate" in mark.kwargs):
            pytest.fail(f"{self.fixture} needs @pytest.mark.{self.marker}(candidate=NAME, ...)", pytrace=False)
        kw = dict(mark.kwargs)
        name = kw.pop("candidate", mark.args[0] if mark.args else "")
        cfg = run.plan.config
        cand = cfg.candidate(name)
        if cfg.reference.model is None or cand.model is None:
            pytest.fail(f"attribution of {name!r} needs reference.model and the candidate's model in the configuration",
                        pytrace=False)
        result = attribute(request_from(cfg.reference.model, cand.model, cfg.suite, progress=False, **kw))
        write_attribution(result, Path(request.config.getoption("fidelity_report_dir")) / "attribution" / name)
        return result

    def write(self, out: Path, payloads: Sequence[JSONDoc], palette_names: Sequence[str] | None) -> Written:
        return Written()


KIND = Attribution()
