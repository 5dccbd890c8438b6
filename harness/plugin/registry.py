"""The one registry of report kinds (:mod:`harness.plugin.kinds`): markers, parametrization, fixtures,
the case functions collected from a ``fidelity.toml`` and the run's writers all loop over it.

Adding a report kind: one module defining its class and one line here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from harness.io.schema import checked
from harness.plugin import (
    kind_adaptive,
    kind_allocate,
    kind_attribution,
    kind_cross_engine,
    kind_paired,
    kind_precision_floor,
    kind_tails,
    kind_window,
)
from harness.plugin.kinds import ReportKind, Written

_P = TypeVar("_P")

#: Every report kind, in the order their artifacts are written and their lines printed.
REPORT_KINDS: tuple[ReportKind[Any], ...] = (  # Any: each kind has its own payload record (write_kind checks it)
    kind_tails.KIND,
    kind_window.KIND,
    kind_paired.KIND,
    kind_cross_engine.KIND,
    kind_adaptive.KIND,
    kind_attribution.KIND,
    kind_allocate.KIND,
    kind_precision_floor.KIND,
)


def write_kind(kind: ReportKind[_P], out: Path, payloads: Sequence[object], palette_names: Sequence[str] | None) -> Written:
    """Controller side: check each payload of ``kind`` (JSON from a worker) against its record, then write them."""
    records = [checked(p, kind.payload, f"<{kind.name} payload {i} of this run>") for i, p in enumerate(payloads)]
    return kind.write(out, records, palette_names)


def write_extras(report_dir: str | Path, extras: Mapping[str, Sequence[object]],
                 palette_names: Sequence[str] | None = None, written: list[Path] | None = None) -> list[str]:
    """Controller side: write the artifacts of every kind with payloads; returns the terminal lines.
    ``palette_names``: the configuration's candidates, which fix each candidate's colour in the figures;
    ``written`` (when given) receives the paths of the files written."""
    out = Path(report_dir)
    lines: list[str] = []
    for kind in REPORT_KINDS:
        payloads = extras.get(kind.name)
        if payloads:
            done = write_kind(kind, out, payloads, palette_names)
            if written is not None:
                written += done.files
            lines += done.lines
    return lines
