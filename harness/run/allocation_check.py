"""Build what ``fidelity allocate`` proposes and score it as ordinary candidates (the harness's scoring path).

Every proposed layout is built by its family (:meth:`harness.allocation.family.Family.build`) and its stored
bytes are read back and compared with the bytes the search predicted (a mismatch is a
:class:`~harness.errors.VerificationError`). The uniform layouts of the chosen choices are built beside them,
and each comparator (the layout whose bytes set a budget: ``int4_g32`` for a budget named ``int4_g32``, the
base candidate for ``base``) joins them. All are scored by :class:`harness.run.session.FidelitySession` --
capture through their engine, the shared head, the shard reports of any other candidate -- on the selected
shards; each proposal is then compared with its comparator on the same positions
(:func:`harness.reports.paired.paired_report`: common random numbers).

Per proposal the result holds the predicted mean KLD (the search's base KLD plus the summed effects, measured
in process on the search's shards; and the same summed effects added to the base layout's KLD as scored here,
when the base is among the candidates: ``predicted_kld_on_measured_base``), the measured mean KLD with its interval (this module, all shards
selected), the measured KLD on the search's own shards (in-sample) and the paired comparison with the
comparator of the same size -- on all selected shards, and on those the search did not measure its effects on
(``paired_held_out``, when both kinds are selected).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from harness.allocation.family import Family, layout_bytes
from harness.allocation.records import AllocationCheck, AllocationResult, CheckProposal, Comparator, PairRow
from harness.errors import FidelityError, VerificationError
from harness.inputs.config import CandidateConfig, FidelityConfig
from harness.inputs.suite import parse_shard_spec
from harness.interchange.suite_manifest import load_any_suite
from harness.reports.aggregate import LadderRow, ladder_rows, write_ladder
from harness.reports.paired import paired_report

if TYPE_CHECKING:
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
                     engine: str = "transformers", base_model: Path | None = None, margin: float = 1e-4) -> AllocationCheck:
    """Build, score and compare (module docstring) with the suite and reference of ``config`` (a
    :class:`~harness.inputs.config.FidelityConfig`); shard reports go to ``out/reports/<candidate>/``."""
    from harness.run.session import FidelitySession

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
    cands = tuple(_candidate(n, engine, m) for n, m in built.items())
    cfg = dataclasses.replace(config, candidates=cands, pairs=(), cache_dir=out / "cache")
    suite = load_any_suite(cfg.suite, verify=False)
    chosen = parse_shard_spec(shards, len(suite.shards))
    session = FidelitySession(config=cfg, device=device)
    reports = []
    for cand in cands:
        for s in chosen:
            scored = session.score(cand, s)
            scored.report.write(out / "reports" / cand.name / f"shard-{s:02d}.json")
            reports.append(scored.report)
    rows = ladder_rows(reports, suite=suite)
    write_ladder(out / "reports", rows)
    by_name = {r["candidate"]: r for r in rows}
    sizes = {name: _on_disk(r) for name, r in by_name.items()}
    search_shards = [s for s in result["suite"]["shards"] if s in chosen]
    base_kinds = set(result["base"]["layout"].values())
    base_name = "base" if "base" in built else (f"uniform-{next(iter(base_kinds))}" if len(base_kinds) == 1 else None)
    base_row = by_name.get(base_name) if base_name is not None else None
    proposals: list[CheckProposal] = []
    for p in result["proposals"]:
        name = f"alloc-{p['budget_spec']}"
        cand = cfg.candidate(name)
        row: CheckProposal = {
            "candidate": name, "budget_spec": p["budget_spec"], "budget_bytes": p["budget_bytes"],
            "predicted_bytes": predicted_bytes[name], "built_bytes": family.built_bytes(built[name]),
            "on_disk_bytes": sizes[name],
            "predicted_kld": p["predicted_kld"], "in_process_kld": p["in_process_kld"], "interaction": p["interaction"],
            "measured_kld": {"value": by_name[name]["mean_kld"], "ci95": by_name[name]["ci95"], "shards": chosen},
        }
        if base_row is not None and base_name is not None:  # the search's predicted change added to the base as scored here
            row["predicted_kld_on_measured_base"] = {"value": base_row["mean_kld"] + p["predicted_delta_kld"]["value"],
                                                     "base": base_name, "base_kld": base_row["mean_kld"]}
        if search_shards:
            row["measured_kld_search_shards"] = {"value": _mean_kld([session.positions(cand, s) for s in search_shards]),
                                                 "shards": search_shards}
        comp = comparators.get(name)
        if comp is not None:
            cc = cfg.candidate(comp)
            rep = paired_report(name, comp, [session.positions(cand, s) for s in chosen],
                                [session.positions(cc, s) for s in chosen], margin=margin, n_boot=cfg.n_boot)
            comparator: Comparator = {
                "candidate": comp, "on_disk_bytes": sizes[comp],
                "measured_kld": {"value": by_name[comp]["mean_kld"], "ci95": by_name[comp]["ci95"]},
                "size_ratio": sizes[name] / sizes[comp],
                "paired": {"diff": rep["kld_mean"]["diff"], "ci95": rep["kld_mean"]["ci95"],
                           "verdict": rep["verdict_named"], "margin": margin}}
            held_out = [s for s in chosen if s not in result["suite"]["shards"]]
            if held_out and len(held_out) < len(chosen):  # the shards the search did not measure its effects on
                rep = paired_report(name, comp, [session.positions(cand, s) for s in held_out],
                                    [session.positions(cc, s) for s in held_out], margin=margin, n_boot=cfg.n_boot)
                comparator["paired_held_out"] = {"shards": held_out, "diff": rep["kld_mean"]["diff"],
                                                 "ci95": rep["kld_mean"]["ci95"], "verdict": rep["verdict_named"]}
            row["comparator"] = comparator
        proposals.append(row)
    wins: list[PairRow] = []
    for q in proposals:
        for u in (n for n in built if n.startswith("uniform-") or n == "base"):
            if sizes[u] < q["on_disk_bytes"]:
                continue  # a smaller candidate: no like-for-like comparison
            cu = cfg.candidate(u)
            cp = cfg.candidate(q["candidate"])
            rep = paired_report(q["candidate"], u, [session.positions(cp, s) for s in chosen],
                                [session.positions(cu, s) for s in chosen], margin=margin, n_boot=cfg.n_boot)
            wins.append({"proposed": q["candidate"], "versus": u, "diff": rep["kld_mean"]["diff"],
                         "ci95": rep["kld_mean"]["ci95"], "verdict": rep["verdict_named"],
                         "proposed_bytes": q["on_disk_bytes"], "versus_bytes": sizes[u]})
    return {"schema": SCHEMA, "family": family.name, "engine": engine, "shards": chosen, "config": str(config.path),
            "candidates": {n: {"model": str(m), "on_disk_bytes": sizes[n],
                               "mean_kld": by_name[n]["mean_kld"], "ci95": by_name[n]["ci95"]} for n, m in built.items()},
            "proposals": proposals, "pairs": wins,
            "plot_points": [{"candidate": r["candidate"], "size_gib": r["size_bytes"] / 2**30 if r["size_bytes"] else None,
                             "mean_kld": r["mean_kld"], "ci95": r["ci95"]} for r in rows]}
