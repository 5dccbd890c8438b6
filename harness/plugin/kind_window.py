"""Report kind ``window``: one case per planned window ``k`` (``window-from<k>``), every candidate rescored
from row ``k`` and compared with the base window.

Artifacts: ``window.json``, ``window.md`` (:mod:`harness.reports.windows`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import FidelityError
from harness.io.kept import kept
from harness.metrics.bootstrap import DEFAULT_SEED
from harness.plugin.kinds import CasePlan, CaseRun, Written
from harness.reports import windows
from harness.reports.windows import (
    WindowComparison,
    WindowPayload,
    WindowSummary,
    compare_windows,
    expected_positions,
    flip_message,
    planned_windows,
    window_summary,
    write_window,
)
from harness.run.summary_cache import statistics_code

if TYPE_CHECKING:
    import pytest
    from _pytest.mark.structures import ParameterSet

    from harness.run.session import FidelitySession
    from harness.run.shard import ShardPositions


def _summary(pos: Sequence[ShardPositions], k: int, n_boot: int) -> WindowSummary:
    """:func:`window_summary`, kept by its positions' content (:func:`harness.io.kept.kept`)."""
    inputs = {"positions": [p.content() for p in pos], "k": k, "n_boot": n_boot, "seed": DEFAULT_SEED}
    return kept("window-summary", inputs, [*statistics_code(), windows.__file__],
                lambda: window_summary(pos, k, n_boot=n_boot))


@dataclass(frozen=True)
class WindowParam:
    """A window case's parameter: the window ``k``, and the notes of the windows the plan skipped."""

    k: int
    notes: tuple[str, ...] = ()


@dataclass
class WindowCase:
    """All candidates summarized from row ``k`` and at the base window, compared."""

    payload: WindowPayload
    expected_positions: int

    @classmethod
    def run(cls, session: FidelitySession, k: int, shards: Sequence[int], notes: Sequence[str] = ()) -> WindowCase:
        base = session.score_from
        n_boot = session.config.n_boot
        summaries: dict[str, WindowSummary] = {}
        base_summaries: dict[str, WindowSummary] = {}
        said = list(notes)
        for cand in session.config.candidates:
            try:
                pos = [session.positions(cand, s) for s in shards]
            except FidelityError as e:  # a candidate that cannot be scored fails its own cases, not this one
                said.append(f"{cand.name} left out of the window comparison: it could not be scored ({e})")
                continue
            summaries[cand.name] = _summary(pos, k, n_boot)
            base_summaries[cand.name] = summaries[cand.name] if k == base else _summary(pos, base, n_boot)
        if not summaries:  # no verdict over an empty table: the case fails naming every refusal
            raise FidelityError(f"window comparison from row {k}: expected at least one candidate scored, found none: "
                                + "; ".join(said))
        n_ctx = sum(len(session.shard_indices(s)) for s in shards)
        payload: WindowPayload = {"base": base, "k": k, "summaries": summaries, "base_summaries": base_summaries, "notes": said,
                   "shards": [int(s) for s in shards]}
        return cls(payload, expected_positions(n_ctx, session.suite.n_ctx, k))

    def comparison(self) -> WindowComparison:
        p = self.payload
        by_window = {p["base"]: p["base_summaries"], p["k"]: p["summaries"]}
        return compare_windows(p["base"], by_window)

    def check(self) -> None:
        """n_positions follows the window arithmetic; a flip real at both windows (paired difference interval) fails, others warn."""
        __tracebackhide__ = True

        p = self.payload
        bad = {c: s["n_positions"] for c, s in p["summaries"].items() if s["n_positions"] != self.expected_positions}
        if bad:
            raise AssertionError(f"score_from={p['k']}: n_positions {bad}, expected {self.expected_positions} "
                                 "(contexts x (n_ctx - 1 - k))")
        w = self.comparison()["windows"][str(p["k"])]
        if w["flips"]["warnings"]:
            warnings.warn(f"score_from={p['k']}: ranking flips within overlapping intervals (noise): "
                          + ", ".join(f"{a}/{b}" for a, b in w["flips"]["warnings"]), UserWarning, stacklevel=2)
        if w["flips"]["failures"]:
            raise AssertionError(flip_message(p["k"], p["base"], w["flips"]["failures"]))


class Window:
    """The same positions summarized from row k: n_positions follows the window arithmetic, and two
    candidates with disjoint intervals never swap places (flips within overlapping intervals warn)."""

    name = "window"
    payload: type[WindowPayload] = WindowPayload
    marker = "fidelity_window"
    marker_doc = "fidelity scoring-window controls"
    param_fixture = "fidelity_window_k"
    fixture = "fidelity_window"
    test = "test_window"
    test_doc = __doc__ or ""

    def params(self, plan: CasePlan) -> list[ParameterSet]:
        import pytest

        run, skipped = planned_windows(plan.n_ctx)
        notes = tuple(note for _, note in skipped)
        params = [pytest.param(WindowParam(k, notes), id=f"window-from{k}") for k in run]
        params += [pytest.param(WindowParam(k), id=f"window-from{k}", marks=pytest.mark.skip(reason=note)) for k, note in skipped]
        return params

    def case(self, run: CaseRun, request: pytest.FixtureRequest, param: object) -> WindowCase:
        """Every selected candidate rescored from row ``k``."""
        if not isinstance(param, WindowParam):
            raise TypeError(f"fidelity_window_k: expected a WindowParam (one of params()), found {type(param).__name__}")
        k, notes = param.k, param.notes
        case = run.compute(f"window from row {k}", lambda: WindowCase.run(run.session, k, list(run.plan.shards), notes))
        run.send(request, self.name, case.payload)
        return case

    def write(self, out: Path, payloads: Sequence[WindowPayload], palette_names: Sequence[str] | None) -> Written:
        cmp = write_window(out, payloads)
        return Written([out / "window.json", out / "window.md"], [f"window: {cmp['verdict']} ({out / 'window.md'})"])


KIND = Window()
