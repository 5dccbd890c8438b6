"""Report kind ``paired``: one case per declared pair (``pair-<a>-vs-<b>``), the two candidates compared on
the same positions (common random numbers).

Artifacts: ``paired/<a>-vs-<b>.json`` and ``.md`` (:mod:`harness.reports.paired`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import FidelityError
from harness.inputs.config import PairConfig
from harness.io.kept import kept
from harness.metrics.bootstrap import DEFAULT_SEED
from harness.plugin.kinds import CasePlan, CaseRun, Written
from harness.reports import paired as paired_module
from harness.reports.paired import PairedReport, check_paired, paired_report, write_paired
from harness.run.floor_cache import floor_for_run
from harness.run.summary_cache import statistics_code

if TYPE_CHECKING:
    import pytest
    from _pytest.mark.structures import ParameterSet

    from harness.run.session import FidelitySession


@dataclass
class PairCase:
    """A declared pair compared on the same positions (common random numbers)."""

    payload: PairedReport
    expect: str | None = None

    @classmethod
    def run(cls, session: FidelitySession, a: str, b: str, margin: float, shards: Sequence[int],
            expect: str | None = None, margin_kind: str = "absolute") -> PairCase:
        ca, cb = session.config.candidate(a), session.config.candidate(b)
        floor_mean = None
        if margin_kind == "floor":  # the floor of the run's shards and window (the ladder's, from the cache)
            floor, line = floor_for_run(session.config, shards=",".join(map(str, shards)), score_from=session.score_from,
                                        key=session.signing_key())
            if floor is None:
                raise FidelityError(f"pair {a} vs {b}: a margin tied to the floor needs it: {line}")
            floor_mean = floor["kld"]["mean"]
        pos_a, pos_b = [session.positions(ca, s) for s in shards], [session.positions(cb, s) for s in shards]
        inputs = {"a": a, "b": b, "pos_a": [p.content() for p in pos_a], "pos_b": [p.content() for p in pos_b],
                  "margin": margin, "score_from": session.score_from, "n_boot": session.config.n_boot,
                  "shards": list(shards), "margin_kind": margin_kind, "floor_mean": floor_mean, "seed": DEFAULT_SEED}
        rep = kept("paired", inputs, [*statistics_code(), paired_module.__file__], lambda: paired_report(
            a, b, pos_a, pos_b, margin=margin, score_from=session.score_from, n_boot=session.config.n_boot, shards=shards,
            margin_kind=margin_kind, floor_mean=floor_mean))
        return cls(rep, expect)

    def check(self) -> None:
        """Internally consistent; equals the declared ``expect`` verdict when the pair declares one."""
        __tracebackhide__ = True

        problems = check_paired(self.payload, self.expect)
        if problems:
            raise AssertionError("\n".join(problems))


class Paired:
    """Common-random-number comparison of a declared pair; fails on a verdict other than its ``expect``."""

    name = "paired"
    payload: type[PairedReport] = PairedReport
    marker = "fidelity_paired"
    marker_doc = "fidelity paired comparisons of two candidates"
    param_fixture = "fidelity_pair"
    fixture = "fidelity_paired"
    test = "test_paired"
    test_doc = __doc__ or ""

    def params(self, plan: CasePlan) -> list[ParameterSet]:
        import pytest

        return [pytest.param(p, id=f"pair-{p.a}-vs-{p.b}") for p in plan.config.pairs]

    def case(self, run: CaseRun, request: pytest.FixtureRequest, param: object) -> PairCase:
        """A declared pair compared on the same positions."""
        if not isinstance(param, PairConfig):
            raise TypeError(f"fidelity_pair: expected a PairConfig (one of params()), found {type(param).__name__}")
        p = param
        case = run.compute(f"pair {p.a} vs {p.b}",
                           lambda: PairCase.run(run.session, p.a, p.b, p.margin, list(run.plan.shards), p.expect,
                                                p.margin_kind))
        run.send(request, self.name, case.payload)
        return case

    def write(self, out: Path, payloads: Sequence[PairedReport], palette_names: Sequence[str] | None) -> Written:
        written = Written()
        for rep in payloads:
            path, md_path = write_paired(out, rep)
            written.files += [path, md_path]
            ci = rep["kld_mean"]["ci95"]
            iv = "not estimable" if ci is None else f"95% [{ci[0]:.4g}, {ci[1]:.4g}]"
            cm = rep.get("certifiable_margin")
            head = f"paired {rep['a']} vs {rep['b']}: {rep['verdict_named']} (diff {rep['kld_mean']['diff']:.4g}, {iv}, "
            warn = f" WARNING: {rep['margin_warning']}" if rep.get("margin_warning") else ""
            written.lines.append(head + (f"margin ±{rep['margin']:.3g}, certifiable ±{cm:.2g}) {path}" if cm is not None
                                         else f"margin ±{rep['margin']:.3g}) {path}") + warn)
        return written


KIND = Paired()
