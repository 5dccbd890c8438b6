"""Report kind ``tails``: one case per candidate (``tails-<name>``), over the selected shards.

Artifacts: ``tails.json``, ``tails.md``, ``tails.png`` (:mod:`harness.reports.tails`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.gate.gate import update_command
from harness.plugin.kinds import CasePlan, CaseRun, Written
from harness.reports.tails import TailReport, baseline_max_p99, check_tails, tail_report, write_tails

if TYPE_CHECKING:
    import pytest
    from _pytest.mark.structures import ParameterSet

    from harness.run.session import FidelitySession


@dataclass
class TailCase:
    """One candidate's tail report over the selected shards."""

    payload: TailReport
    max_p99: float | None
    #: The command that updates the candidate's baseline, appended when the pooled p99 is over its ``max_p99``.
    update_hint: str = ""

    @classmethod
    def run(cls, session: FidelitySession, name: str, shards: Sequence[int]) -> TailCase:
        cand = session.config.candidate(name)
        rep = tail_report(name, [(s, session.positions(cand, s)) for s in shards], session.score_from)
        limit = baseline_max_p99(session.config.baselines, name, shards)
        rep["max_p99_baseline"] = limit
        rep["problems"] = check_tails(rep, limit)
        return cls(rep, limit)

    def check(self) -> None:
        __tracebackhide__ = True
        problems = self.payload.get("problems", [])
        if problems:
            message = "\n".join(problems)
            if self.update_hint and "max_p99 of its baseline" in message:
                message += "\n" + self.update_hint
            raise AssertionError(message)


class Tails:
    """Cumulative exceedances equal the shards' sum, pooled percentiles lie in their histogram brackets,
    the pooled max is the shards' max, and the pooled p99 is not certainly above the baseline's ``max_p99``."""

    name = "tails"
    payload: type[TailReport] = TailReport
    marker = "fidelity_tails"
    marker_doc = "fidelity tail reports (percentiles, CVaR, exceedances)"
    param_fixture = "fidelity_tail_candidate"
    fixture = "fidelity_tails"
    test = "test_tails"
    test_doc = __doc__ or ""

    def params(self, plan: CasePlan) -> list[ParameterSet]:
        return [plan.param(n, f"tails-{n}", n) for n in plan.case_names]

    def case(self, run: CaseRun, request: pytest.FixtureRequest, param: object) -> TailCase:
        """A candidate's tail report over the selected shards (those actually scored after an adaptive stop)."""
        name = str(param)
        shards = list(run.plan.shards)
        monitor = run.monitor
        if monitor is not None and name in monitor.stopped:
            shards = sorted(monitor.seen[name])

        case = run.compute(f"tails of {name}", lambda: TailCase.run(run.session, name, shards))
        case.update_hint = ("if this p99 change is intended, update the baseline with: "
                            f"{update_command(name, run.plan.selector)}")
        run.send(request, self.name, case.payload)
        return case

    def write(self, out: Path, payloads: Sequence[TailReport], palette_names: Sequence[str] | None) -> Written:
        files = write_tails(out, payloads, palette_names)
        return Written(list(files), [f"tails: {out / 'tails.md'}, {out / 'tails.png'}"])


KIND = Tails()
