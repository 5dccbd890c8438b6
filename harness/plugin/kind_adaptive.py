"""Report kind ``adaptive``: the record of each shard scored under ``--fidelity-adaptive`` (sent by the
candidate x shard case; no marker or case of its own).

Artifacts: ``adaptive.json``, ``adaptive.md`` (:mod:`harness.gate.adaptive`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.gate.adaptive import AdaptiveRecord, write_adaptive
from harness.plugin.kinds import CaseRun, Uncollected, Written

if TYPE_CHECKING:
    import pytest


class Adaptive(Uncollected):
    """Where each candidate's adaptive ladder stopped."""

    name = "adaptive"
    payload: type[AdaptiveRecord] = AdaptiveRecord
    marker = None
    marker_doc = ""

    def case(self, run: CaseRun, request: pytest.FixtureRequest, param: object) -> None:
        raise NotImplementedError("adaptive records are sent by the candidate x shard cases")

    def write(self, out: Path, payloads: Sequence[AdaptiveRecord], palette_names: Sequence[str] | None) -> Written:
        write_adaptive(out, payloads)
        written = Written([out / "adaptive.json", out / "adaptive.md"])
        for r in (r for r in payloads if r["side"] and r["look"] < r["looks"]):
            written.lines.append(f"adaptive: {r['candidate']} stopped after shard {r['shard']:02d} (look {r['look']}/"
                                 f"{r['looks']}, {'below' if r['side'] == 'below' else 'above'} max_mean_kld)")
        written.lines.append(f"adaptive: {out / 'adaptive.md'}")
        return written


KIND = Adaptive()
