"""Build what ``fidelity allocate`` proposes and score it as ordinary candidates (the harness's scoring path).

Reasoning: docs/allocation.md §"Building and scoring proposals".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from harness.allocation.family import Family, layout_bytes
from harness.allocation.records import (
    AllocationCheck,
    AllocationResult,
    CheckCandidate,
    CheckProposal,
    Comparator,
    PairedDiff,
    PairRow,
    Proposal,
)
from harness.errors import FidelityError, VerificationError
from harness.inputs.config import CandidateConfig, FidelityConfig
from harness.inputs.suite import parse_shard_spec
from harness.interchange.suite_manifest import load_any_suite
from harness.io.atomic import atomic_write_files
from harness.reports.aggregate import LadderRow, ladder_files, ladder_rows
from harness.reports.paired import paired_report
from harness.reports.report_folder import open_report_folder

if TYPE_CHECKING:
    from harness.run.session import FidelitySession
    from harness.run.shard import ShardPositions

SCHEMA: Final = "fidelity.allocation-check/1"


def _mean_kld(positions: Sequence[ShardPositions]) -> float:
    """Token-mean KLD over the scored positions of some shards (compensated sum)."""
    values = [float(v) for p in positions for v in p.scores.kld]
    return math.fsum(values) / len(values)


def _candidate(name: str, engine: str, model: Path) -> CandidateConfig:
    return CandidateConfig(name, engine, model.resolve(), None, None, None, ("allocation",))


def _on_disk(row: LadderRow) -> int:
    """A built candidate's on-disk bytes (its reports always record them)."""
    if row["size_bytes"] is None:
        raise FidelityError(f"{row['candidate']}: its shard reports record no on-disk size (candidate.size_bytes)")
    return row["size_bytes"]


def check_allocation(config: FidelityConfig, result: AllocationResult, family: Family, out: Path, *,
                     uniforms: Sequence[str] = (), shards: str | None = None, device: str = "cpu",
                     engine: str = "transformers", base_model: Path | None = None, margin: float = 1e-4,
                     command: str = "fidelity allocate --check") -> AllocationCheck:
    """Build, score and compare (docs/allocation.md §"Building and scoring proposals") with the suite and reference of ``config`` (a
    :class:`~harness.inputs.config.FidelityConfig`); shard reports go to ``out/reports/<candidate>/``, a report
    folder of the config's suite (:mod:`harness.reports.report_folder`: checked before anything is built, its
    reports and ladder recorded in its ledger with ``command``)."""
    from harness.run.session import FidelitySession

    suite = load_any_suite(config.suite, verify=False)
    folder = open_report_folder(out / "reports", suite.suite_token_sha256, command, config=config.path)
    built, predicted_bytes = _build_layouts(result, family, out, uniforms)
    comparators = _comparators(result, built, base_model)
    cands = tuple(_candidate(n, engine, m) for n, m in built.items())
    cfg = dataclasses.replace(config, candidates=cands, pairs=(), cache_dir=out / "cache")
    chosen = parse_shard_spec(shards, len(suite.shards))
    session = FidelitySession(config=cfg, device=device)
    reports = []
    written: list[Path] = []
    for cand in cands:
        for s in chosen:
            scored = session.score(cand, s)
            written += scored.report.write(out / "reports" / cand.name / f"shard-{s:02d}.json")
            reports.append(scored.report)
    rows = ladder_rows(reports, suite=suite)
    ladder = ladder_files(out / "reports", rows)
    atomic_write_files(ladder)  # ladder.md and ladder.json: both or neither
    folder.record([*written, *ladder])
    by_name = {r["candidate"]: r for r in rows}
    sizes = {name: _on_disk(r) for name, r in by_name.items()}
    measured: dict[str, CheckCandidate] = {
        n: {"model": str(m), "on_disk_bytes": sizes[n], "mean_kld": by_name[n]["mean_kld"], "ci95": by_name[n]["ci95"]}
        for n, m in built.items()}
    check = _Check(session, cfg, chosen, measured, margin)
    base_kinds = set(result["base"]["layout"].values())
    base_name = "base" if "base" in built else (f"uniform-{next(iter(base_kinds))}" if len(base_kinds) == 1 else None)
    proposals: list[CheckProposal] = []
    for p in result["proposals"]:
        name = f"alloc-{p['budget_spec']}"
        proposals.append(_proposal(check, p, name, predicted_bytes[name], family.built_bytes(built[name]),
                                   base_name if base_name in by_name else None, result["suite"]["shards"],
                                   comparators.get(name)))
    return {"schema": SCHEMA, "family": family.name, "engine": engine, "shards": chosen, "config": str(config.path),
            "candidates": measured, "proposals": proposals, "pairs": _wins(check, proposals, built),
            "plot_points": [{"candidate": r["candidate"], "size_gib": r["size_bytes"] / 2**30 if r["size_bytes"] else None,
                             "mean_kld": r["mean_kld"], "ci95": r["ci95"]} for r in rows]}


def _build_layouts(result: AllocationResult, family: Family, out: Path,
                   uniforms: Sequence[str]) -> tuple[dict[str, Path], dict[str, int]]:
    """Each proposal (``alloc-<budget>``) and uniform layout (``uniform-<choice>``) built under ``out/candidates``,
    and the stored bytes predicted for it; a built layout whose bytes differ is a :class:`VerificationError`."""
    built: dict[str, Path] = {}
    predicted_bytes: dict[str, int] = {}
    for p in result["proposals"]:
        name = f"alloc-{p['budget_spec']}"
        built[name] = family.build(p["layout"], out / "candidates" / name)
        predicted_bytes[name] = int(p["predicted_bytes"])
    for c in uniforms:
        name = f"uniform-{c}"
        layout = {u: c for u in family.units}
        built[name] = family.build(layout, out / "candidates" / name)
        predicted_bytes[name] = layout_bytes(family, layout)
    for name, model in built.items():
        found = family.built_bytes(model)
        if found != predicted_bytes[name]:
            raise VerificationError(model, "stored tensor bytes of the built layout", predicted_bytes[name], found)
    return built, predicted_bytes


def _comparators(result: AllocationResult, built: dict[str, Path], base_model: Path | None) -> dict[str, str]:
    """``{proposal: comparator}``: the base candidate for budget ``base`` (added to ``built``), the uniform
    layout of a budget named by a choice when it was built."""
    comparators: dict[str, str] = {}
    for p in result["proposals"]:
        spec = p["budget_spec"]
        if spec == "base":
            if base_model is None:
                raise FidelityError("budget 'base': pass the base candidate (base_model) to compare with")
            built.setdefault("base", base_model)
            comparators[f"alloc-{spec}"] = "base"
        elif f"uniform-{spec}" in built:
            comparators[f"alloc-{spec}"] = f"uniform-{spec}"
    return comparators


@dataclass(frozen=True)
class _Check:
    """The scored candidates of a check: the session that holds their positions, the shards selected, each
    candidate's measured KLD and bytes, and the equivalence margin of the paired comparisons."""

    session: FidelitySession
    cfg: FidelityConfig
    chosen: list[int]
    measured: dict[str, CheckCandidate]
    margin: float

    def positions(self, name: str, shards: Sequence[int]) -> list[ShardPositions]:
        cand = self.cfg.candidate(name)
        return [self.session.positions(cand, s) for s in shards]

    def paired(self, a: str, b: str, shards: Sequence[int]) -> PairedDiff:
        """``KLD(a) − KLD(b)`` on the same positions of ``shards`` (:func:`harness.reports.paired.paired_report`)."""
        rep = paired_report(a, b, self.positions(a, shards), self.positions(b, shards), margin=self.margin,
                            n_boot=self.cfg.n_boot)
        return {"diff": rep["kld_mean"]["diff"], "ci95": rep["kld_mean"]["ci95"], "verdict": rep["verdict_named"]}


def _proposal(check: _Check, p: Proposal, name: str, predicted_bytes: int, built_bytes: int, base_name: str | None,
              search: list[int], comp: str | None) -> CheckProposal:
    """One proposal as built and scored, against the base as scored here, the search's own shards
    (``search``) and its comparator ``comp``."""
    chosen, me = check.chosen, check.measured[name]
    row: CheckProposal = {
        "candidate": name, "budget_spec": p["budget_spec"], "budget_bytes": p["budget_bytes"],
        "predicted_bytes": predicted_bytes, "built_bytes": built_bytes, "on_disk_bytes": me["on_disk_bytes"],
        "predicted_kld": p["predicted_kld"], "in_process_kld": p["in_process_kld"], "interaction": p["interaction"],
        "measured_kld": {"value": me["mean_kld"], "ci95": me["ci95"], "shards": chosen},
    }
    if base_name is not None:  # the search's predicted change added to the base as scored here
        base_kld = check.measured[base_name]["mean_kld"]
        row["predicted_kld_on_measured_base"] = {"value": base_kld + p["predicted_delta_kld"]["value"],
                                                 "base": base_name, "base_kld": base_kld}
    search_shards = [s for s in search if s in chosen]
    if search_shards:
        row["measured_kld_search_shards"] = {"value": _mean_kld(check.positions(name, search_shards)),
                                             "shards": search_shards}
    if comp is not None:
        them = check.measured[comp]
        comparator: Comparator = {
            "candidate": comp, "on_disk_bytes": them["on_disk_bytes"],
            "measured_kld": {"value": them["mean_kld"], "ci95": them["ci95"]},
            "size_ratio": me["on_disk_bytes"] / them["on_disk_bytes"],
            "paired": {**check.paired(name, comp, chosen), "margin": check.margin}}
        held_out = [s for s in chosen if s not in search]
        if held_out and len(held_out) < len(chosen):  # the shards the search did not measure its effects on
            comparator["paired_held_out"] = {"shards": held_out, **check.paired(name, comp, held_out)}
        row["comparator"] = comparator
    return row


def _wins(check: _Check, proposals: list[CheckProposal], built: dict[str, Path]) -> list[PairRow]:
    """Each proposal against every uniform layout (and the base) at least as large, on the same positions."""
    wins: list[PairRow] = []
    for q in proposals:
        for u in (n for n in built if n.startswith("uniform-") or n == "base"):
            if check.measured[u]["on_disk_bytes"] < q["on_disk_bytes"]:
                continue  # a smaller candidate: no like-for-like comparison
            wins.append({"proposed": q["candidate"], "versus": u, **check.paired(q["candidate"], u, check.chosen),
                         "proposed_bytes": q["on_disk_bytes"], "versus_bytes": check.measured[u]["on_disk_bytes"]})
    return wins
