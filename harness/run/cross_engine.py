"""Cross-engine floors: the same weights through several engines, compared pairwise, and each
candidate's KLD net of the floor of the engine that serves it (``pytest -m fidelity_cross_engine``).

All numbers are over one shard's positions, in nats.

Reasoning: docs/engines.md §"Cross-engine floors".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

import numpy as np

from harness.errors import FidelityError, VerificationError
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.jsonio import JSONObject
from harness.io.md_table import md_table
from harness.io.schema import check, schema_of
from harness.metrics.tails import quantile
from harness.reports.numbers import fmt_g
from harness.run.shard_inputs import ShardInputs
from harness.run.verify import check_contexts, check_widths

if TYPE_CHECKING:
    from harness.capture.store import CaptureStore
    from harness.inputs.head import HeadTensor
    from harness.inputs.suite import Suite
    from harness.metrics.scores import PositionScores

SCHEMA = "fidelity.cross-engine/1"
#: How every cell reads.
DIRECTION = "cell (row R, column C) = KL(P_R || Q_C): the row engine is the reference distribution, the column engine the candidate"


@dataclass(frozen=True)
class Cell:
    """One scored pair: ``KL(P_reference || Q_candidate)`` over ``n_positions`` positions."""

    #: Row engine: its distribution is P, the reference side of the KL.
    reference: str
    #: Column engine: its distribution is Q, the candidate side.
    candidate: str
    mean_kld: float
    #: numpy "linear" 99th percentile of the per-position KLD.
    p99: float
    #: Fraction of positions whose argmaxes agree.
    top1: float
    n_positions: int
    #: How the two captures were scored (hidden states through the head, logits, or mixed).
    mode: str

    @property
    def direction(self) -> str:
        return f"KL({self.reference} || {self.candidate})"

    @classmethod
    def of(cls, reference: str, candidate: str, scores: PositionScores, mode: str) -> Cell:
        """The cell's statistics from the per-position scores of the pair."""
        return cls(reference, candidate, *stats(scores, f"cross-engine pair {reference} -> {candidate}"), mode)


def stats(scores: PositionScores, what: str) -> tuple[float, float, float, int]:
    """``(mean KLD, p99 KLD, top-1 agreement, positions)`` of per-position scores (float64)."""
    if len(scores) == 0:
        raise FidelityError(f"{what}: no positions scored")
    kld = np.asarray(scores.kld, dtype=np.float64)
    return float(kld.mean()), quantile(kld, 0.99), float(np.mean(scores.top1)), len(scores)


@dataclass
class FloorMatrix:
    """The pairwise matrix of one shard: scored cells and skipped pairs, by ``(row, column)`` engine."""

    engines: tuple[str, ...]
    shard: int
    #: The engine whose row gives each engine's floor (the reference the candidates are scored against).
    floor_row: str = "transformers"
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    skipped: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Facts printed under the matrix (e.g. which runtimes the two captures of a diagonal cell came from).
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.floor_row not in self.engines:
            raise FidelityError(f"floor row {self.floor_row!r} is not one of the engines {', '.join(self.engines)}")

    def _check(self, reference: str, candidate: str) -> None:
        for e in (reference, candidate):
            if e not in self.engines:
                raise FidelityError(f"engine {e!r} is not one of the matrix's engines {', '.join(self.engines)}")

    def add(self, cell: Cell) -> None:
        """Record a scored pair (replacing a skip of the same pair)."""
        self._check(cell.reference, cell.candidate)
        self.cells[(cell.reference, cell.candidate)] = cell
        self.skipped.pop((cell.reference, cell.candidate), None)

    def skip(self, reference: str, candidate: str, reason: str) -> None:
        """Record a pair that was not scored, with the reason."""
        self._check(reference, candidate)
        if (reference, candidate) in self.cells:
            raise FidelityError(f"pair {reference} -> {candidate} is scored; it cannot also be skipped")
        self.skipped[(reference, candidate)] = reason

    def cell(self, reference: str, candidate: str) -> Cell | None:
        return self.cells.get((reference, candidate))

    def floor(self, engine: str) -> Cell | None:
        """floor_E: the cell (``floor_row``, ``engine``), or None when that pair was skipped."""
        return self.cells.get((self.floor_row, engine))

    def floor_note(self, engine: str) -> str:
        """Why floor_E is missing ('' when it is there)."""
        if engine not in self.engines:
            return f"no floor is measured for engine {engine!r} (floors: {', '.join(self.engines)})"
        if self.floor(engine) is not None:
            return ""
        reason = self.skipped.get((self.floor_row, engine), "not scored")
        return f"floor_{engine} missing: {reason}"


@dataclass(frozen=True)
class NetRow:
    """A candidate's KLD with its engine's floor beside it; ``net_of_floor`` = mean_kld − floor."""

    candidate: str
    engine: str
    #: The configuration file that lists the candidate.
    config: str
    mean_kld: float | None
    p99: float | None
    top1: float | None
    n_positions: int
    floor: float | None
    size_bytes: int | None = None
    #: Why a value is missing ('' when none is).
    note: str = ""

    @property
    def net_of_floor(self) -> float | None:
        if self.mean_kld is None or self.floor is None:
            return None
        return self.mean_kld - self.floor


def net_row(candidate: str, engine: str, config: str, scores: PositionScores, matrix: FloorMatrix,
            size_bytes: int | None = None) -> NetRow:
    """A scored candidate's row: its own statistics, and floor_E of its engine from ``matrix``."""
    mean, p99, top1, n = stats(scores, f"candidate {candidate}")
    f = matrix.floor(engine)
    return NetRow(candidate, engine, config, mean, p99, top1, n, None if f is None else f.mean_kld, size_bytes,
                  matrix.floor_note(engine))


def skipped_row(candidate: str, engine: str, config: str, reason: str, matrix: FloorMatrix) -> NetRow:
    """A candidate that was not scored (its engine is missing), with the reason."""
    f = matrix.floor(engine)
    return NetRow(candidate, engine, config, None, None, None, 0, None if f is None else f.mean_kld, None, reason)


def score_pair(*, suite: Suite, shard: int, reference: CaptureStore, candidate: CaptureStore, head: HeadTensor,
               reference_engine: str, candidate_engine: str) -> tuple[Cell, PositionScores]:
    """Score ``candidate`` against ``reference`` on ``shard`` (either store may be hidden states or
    logits: a hidden-state side goes through ``head``) after the width and context joins; returns the
    cell and the per-position scores it summarizes (in the shard's context order)."""
    from harness.run.shard import shard_positions

    check_widths(suite, reference, candidate, head)
    check_contexts([reference, candidate], suite, [shard])
    pos = shard_positions(ShardInputs(suite=suite, shard=shard, reference=reference, candidate=candidate, head=head))
    return Cell.of(reference_engine, candidate_engine, pos.scores, pos.mode), pos.scores


# ----------------------------------------------------------------------------- rendering


def _grid(m: FloorMatrix, title: str, value: Callable[[Cell], str]) -> list[str]:
    return md_table([f"{title} (row R = reference P, column C = candidate Q)", *m.engines],
                    [[f"**{r}**", *("skipped" if (cell := m.cell(r, c)) is None else value(cell) for c in m.engines)]
                     for r in m.engines])


def matrix_lines(m: FloorMatrix) -> list[str]:
    """The matrix as three Markdown grids (mean KLD, p99, top-1) plus the skipped pairs' reasons."""
    n = sorted({c.n_positions for c in m.cells.values()})
    lines = [f"Floor matrix, shard {m.shard}" + (f", {'/'.join(map(str, n))} positions" if n else "") + f". {DIRECTION}.", ""]
    lines += _grid(m, "mean KL(P_R ‖ Q_C), nats", lambda c: fmt_g(c.mean_kld))
    lines += [""] + _grid(m, "p99 KL(P_R ‖ Q_C), nats", lambda c: fmt_g(c.p99))
    lines += [""] + _grid(m, "top-1 agreement", lambda c: f"{c.top1:.4f}")
    if m.skipped:
        lines.append("")
        for (r, c), reason in sorted(m.skipped.items()):
            lines.append(f"- skipped KL({r} || {c}): {reason}")
    if m.notes:
        lines.append("")
        lines += [f"- {n}" for n in m.notes]
    return lines


def net_lines(m: FloorMatrix, rows: Sequence[NetRow]) -> list[str]:
    """The candidates' table: own mean KLD, the floor of their engine beside it, and the net value."""
    lines = [f"Candidates, shard {m.shard}: KL({m.floor_row} reference || candidate); floor_E = KL({m.floor_row} || E on the "
             "same bf16 weights); net of floor = mean KLD − floor_E (a label, not a correction: rounding noise "
             "changes with the weights, and the rounding all bf16 engines share is the precision floor, not in floor_E)", ""]

    def opt(x: float | None, signed: bool = False) -> str:
        if x is None:
            return "—"
        return f"{x:+.3e}" if signed else fmt_g(x)

    lines += md_table(["candidate", "engine", "config", "mean KLD", "floor_E", "net of floor", "p99 KLD", "top-1", "bytes"],
                      [[r.candidate, r.engine, r.config, opt(r.mean_kld), opt(r.floor), opt(r.net_of_floor, signed=True),
                        opt(r.p99), "—" if r.top1 is None else f"{r.top1:.4f}",
                        "—" if r.size_bytes is None else r.size_bytes] for r in rows])
    notes = [r for r in rows if r.note]
    if notes:
        lines.append("")
        lines += [f"- {r.candidate}: {r.note}" for r in notes]
    return lines


def render_markdown(m: FloorMatrix, rows: Sequence[NetRow]) -> str:
    """``cross_engine.md``."""
    lines = ["# Cross-engine floors (the same bf16 weights through each engine)", ""]
    lines += matrix_lines(m) + [""] + net_lines(m, rows)
    return "\n".join(lines) + "\n"


def to_json_dict(m: FloorMatrix, rows: Sequence[NetRow]) -> JSONObject:
    """``cross_engine.json`` (docs/engines.md §"Cross-engine floors")."""
    return {
        "schema": SCHEMA, "shard": m.shard, "floor_row": m.floor_row, "engines": list(m.engines), "direction": DIRECTION,
        "cells": [{"reference": c.reference, "candidate": c.candidate, "direction": c.direction, "mean_kld": c.mean_kld,
                   "p99": c.p99, "top1": c.top1, "n_positions": c.n_positions, "mode": c.mode}
                  for c in sorted(m.cells.values(), key=lambda c: (m.engines.index(c.reference), m.engines.index(c.candidate)))],
        "skipped": [{"reference": r, "candidate": c, "reason": reason} for (r, c), reason in sorted(m.skipped.items())],
        "notes": list(m.notes),
        "candidates": [{"name": r.candidate, "engine": r.engine, "config": r.config, "mean_kld": r.mean_kld, "floor": r.floor,
                        "net_of_floor": r.net_of_floor, "p99": r.p99, "top1": r.top1, "n_positions": r.n_positions,
                        "size_bytes": r.size_bytes, "note": r.note} for r in rows],
    }


class _CellDoc(TypedDict):
    reference: str
    candidate: str
    mean_kld: float
    p99: float
    top1: float
    n_positions: int
    mode: str


class _SkippedDoc(TypedDict):
    reference: str
    candidate: str
    reason: str


class _RowDoc(TypedDict):
    name: str
    engine: str
    config: str
    mean_kld: float | None
    p99: float | None
    top1: float | None
    n_positions: int
    floor: float | None
    size_bytes: int | None
    note: str


class _CrossEngineDoc(TypedDict):
    """What :func:`from_json_dict` reads of ``cross_engine.json`` (other keys are kept, unread)."""

    schema: str
    engines: list[str]
    shard: int
    floor_row: str
    cells: list[_CellDoc]
    skipped: list[_SkippedDoc]
    notes: list[str]
    candidates: list[_RowDoc]


_DOC_SCHEMA = schema_of(_CrossEngineDoc)


def from_json_dict(doc: object, where: str = "<cross-engine payload>") -> tuple[FloorMatrix, list[NetRow]]:
    """Inverse of :func:`to_json_dict` (how the pytest controller receives a worker's result)."""
    found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
    if found != SCHEMA:
        raise FidelityError(f"{where}: schema: expected {SCHEMA!r}, found {found!r}")
    try:
        check(doc, _DOC_SCHEMA, where)
        d = cast(_CrossEngineDoc, doc)  # checked above
        m = FloorMatrix(tuple(d["engines"]), d["shard"], d["floor_row"])
        for c in d["cells"]:
            m.add(Cell(c["reference"], c["candidate"], float(c["mean_kld"]), float(c["p99"]), float(c["top1"]),
                       c["n_positions"], c["mode"]))
        for s in d["skipped"]:
            m.skip(s["reference"], s["candidate"], s["reason"])
        m.notes.extend(d["notes"])
        rows = [NetRow(r["name"], r["engine"], r["config"], r["mean_kld"], r["p99"], r["top1"], r["n_positions"],
                       r["floor"], r["size_bytes"], r["note"]) for r in d["candidates"]]
    except (VerificationError, ValueError) as e:
        raise FidelityError(f"{where}: malformed cross-engine document ({type(e).__name__}: {e})") from None
    return m, rows


def write_cross_engine(out: str | Path, m: FloorMatrix, rows: Sequence[NetRow]) -> list[Path]:
    """Write ``cross_engine.md`` and ``cross_engine.json`` into ``out`` as one unit."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    return atomic_write_files({folder / "cross_engine.md": render_markdown(m, rows),
                               folder / "cross_engine.json": dumps_json(to_json_dict(m, rows))})
