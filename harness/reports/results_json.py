"""``results.json``: a ladder as one entry per measured file, for plotting (the GGUF metrics record's form).

Reasoning: docs/interchange.md §"results.json".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from harness.reports.aggregate import LadderRow, NotMeasured

SCHEMA = "fidelity.kld-results/1"
GIB = float(1 << 30)


class ResultEntry(TypedDict):
    """One measured candidate of ``results.json`` (module docstring)."""

    name: str
    size_bytes: int | None
    size_gib: float | None
    bits_per_weight: object
    mean_kld: float
    ci95: list[float] | None
    top1: float
    n_positions: int
    shards: list[int]
    engine: object
    identity: object
    command: str


class ResultsDocument(TypedDict):
    """``results.json`` (``fidelity.kld-results/1``; module docstring)."""

    schema: str
    command: str
    entries: list[ResultEntry]
    not_measured: list[NotMeasured]


def results_document(rows: Sequence[LadderRow], command: str, remeasure: str,
                     not_measured: Sequence[NotMeasured] = ()) -> ResultsDocument:
    """The ``results.json`` of ladder ``rows`` (:func:`harness.reports.aggregate.ladder_rows`); ``remeasure``
    is formatted with ``{name}`` for each entry's ``command``."""
    entries: list[ResultEntry] = []
    for r in rows:
        comp = r["aggregate"]["comparability"]
        size = r["size_bytes"]
        entries.append({"name": r["candidate"], "size_bytes": size, "size_gib": None if not size else size / GIB,
                        "bits_per_weight": r.get("bits_per_weight"),
                        "mean_kld": r["mean_kld"], "ci95": r["ci95"], "top1": r["top1"], "n_positions": r["n_positions"],
                        "shards": r["shards"], "engine": comp["engine"].get("candidate"),
                        "identity": comp["candidate"].get("identity"), "command": remeasure.format(name=r["candidate"])})
    return {"schema": SCHEMA, "command": command, "entries": entries, "not_measured": list(not_measured)}
