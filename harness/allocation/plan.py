"""``fidelity allocate``: measure per-group effects, solve the knapsack for each budget, predict, check additivity.

Inputs: the reference model, a family of choices (:mod:`harness.allocation.family`), a grouping
(:func:`harness.allocation.choices.make_groups`), a base layout, the suite's shards to measure on, and budgets.

Reasoning: docs/allocation.md §"The search's steps".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypedDict, Unpack

import numpy as np

from harness.allocation.choices import Group, make_groups
from harness.allocation.family import Family, layout_bytes
from harness.allocation.knapsack import solve
from harness.allocation.measure import InProcess, group_variants, with_group
from harness.allocation.proxy import group_proxy, rank_agreement, unit_errors
from harness.allocation.records import AllocationResult, EffectRow, Proposal, ProxyRecord, TimingRecord
from harness.attribution.effects import INTERVAL_METHOD, INTERVAL_METHOD_TEXT, PairedMeans, TestedEstimate, tested
from harness.errors import FidelityError
from harness.inputs.suite import Suite

SCHEMA: Final = "fidelity.allocation/1"
EFFECTS = ("measured", "proxy")
ADDITIVITY = ("predicted KLD(L) = KLD(base) + Σ_g Δ(g, L_g), each Δ measured with every other group at the base "
              "layout; checked by measuring each proposed layout (interaction = measured − predicted)")
#: What ``proxy.definition`` of the result says the proxy is.
PROXY_DEFINITION = ("Σ_u ‖X(W_c − W)ᵀ‖² / ‖XWᵀ‖² − (the same at the base choice), X the unit's "
                    "reference inputs (teacher-forced)")


@dataclass(frozen=True)
class AllocationRequest:
    """What to allocate: the family's choices over groups of units, measured on ``shards`` of the suite."""

    reference: Path
    suite: Path
    family: Family
    base: str
    budgets: tuple[str, ...]
    grouping: str = "block"
    shards: str | None = "0"
    effects: str = "measured"
    proxy_contexts: int = 4
    n_boot: int = 10_000
    seed: int = 20240601
    device: str = "cpu"
    progress: bool = True


class RequestOptions(TypedDict, total=False):
    """The optional fields of an :class:`AllocationRequest` (their defaults are the request's)."""

    grouping: str
    shards: str | None
    effects: str
    proxy_contexts: int
    n_boot: int
    seed: int
    device: str
    progress: bool


def budget_key(spec: str, family: Family) -> str:
    """A budget as the search names it: bytes and ``base`` as given, a choice in the family's spelling."""
    s = spec.strip()
    return s.upper() if family.name == "gguf" and not (s.isascii() and s.isdigit()) and s != "base" else s


def resolve_budget(spec: str, family: Family, base: dict[str, str]) -> tuple[int, str]:
    """``(bytes, what it is)`` of one budget (docs/allocation.md §"The search's steps")."""
    s = budget_key(spec, family)
    if s.isascii() and s.isdigit():  # ASCII digits only: '²' or '٣' are not a byte count
        return int(s), f"{int(s)} bytes"
    if s == "base":
        return layout_bytes(family, base), "the base layout's bytes"
    if s not in family.choices:
        raise FidelityError(f"budget {spec!r}: expected a number of bytes, 'base' or one of the choices "
                            f"({', '.join(family.choices)})")
    return layout_bytes(family, {u: s for u in family.units}), f"the bytes of uniform {s}"


def _estimate(pm: PairedMeans, per_context: np.ndarray, nonnegative: bool = False) -> TestedEstimate:
    return tested(pm.estimate(per_context, nonnegative=nonnegative))


def allocate(req: AllocationRequest) -> AllocationResult:
    """Run the search (docs/allocation.md §"The search's steps"); returns the JSON-ready result (schema :data:`SCHEMA`)."""
    if req.effects not in EFFECTS:
        raise FidelityError(f"effects {req.effects!r}: expected one of {', '.join(EFFECTS)}")
    t0 = time.perf_counter()
    fam = req.family
    suite = Suite.load(req.suite, verify=True)
    shards = suite.parse_shards(req.shards)
    indices = suite.context_indices(shards)
    tokens = np.asarray(suite.tokens[indices])
    base = fam.base_layout(req.base)
    groups: list[Group] = make_groups(fam.units, req.grouping)
    budgets = [(budget_key(spec, fam), *resolve_budget(spec, fam, base)) for spec in req.budgets]
    _check_budgets(fam, groups, base, budgets)
    run = InProcess(req.reference, fam, tokens, device=req.device)
    positions = np.full(len(indices), suite.n_ctx - 1, dtype=np.int64)
    pm = PairedMeans([suite.contexts[i].source_cluster for i in indices], positions, n_boot=req.n_boot, seed=req.seed)

    variants = group_variants([(g.name, g.units) for g in groups], base, fam.choices)
    base_sum, sums = _score_variants(run, base, groups, variants, req.progress)
    t1 = time.perf_counter()
    inputs = run.unit_inputs(min(req.proxy_contexts, len(tokens)))
    errors = unit_errors(fam, inputs, run.original)
    base_kld = _estimate(pm, base_sum, nonnegative=True)

    effect_rows = _effect_rows(pm, fam, base, groups, variants, sums, base_sum, errors)
    agreement = rank_agreement([r["proxy"] for r in effect_rows], [r["delta_kld"]["value"] for r in effect_rows])
    base_energy = sum(errors[u][base[u]] for u in fam.units)
    scale = base_kld["value"] / base_energy if base_energy > 0 else 0.0
    options = _options(fam, base, groups, effect_rows, req.effects, scale)
    proposals = [_propose(run, pm, fam, base, groups, options, (spec, budget, what), sums, base_sum)
                 for spec, budget, what in budgets]
    t2 = time.perf_counter()
    return _result(req, suite, shards, pm, groups, base, base_kld, effect_rows, proposals,
                   proxy={"definition": PROXY_DEFINITION, "contexts": min(req.proxy_contexts, len(tokens)),
                          "scale_nats_per_unit": scale, "rank_agreement": agreement},
                   n_contexts=len(indices), variants_scored=run.variants_scored,
                   timing={"effects_s": t1 - t0, "proposals_s": t2 - t1, "total_s": time.perf_counter() - t0})


def _check_budgets(fam: Family, groups: list[Group], base: dict[str, str], budgets: list[tuple[str, int, str]]) -> None:
    """Refuse, before any measurement, a budget below the smallest layout of these choices."""
    # each group at its cheapest option (a choice, or the base layout's own units)
    cheapest = [min([sum(fam.unit_bytes(u, c) for u in g.units) for c in fam.choices]
                    + [sum(fam.unit_bytes(u, base[u]) for u in g.units)]) for g in groups]
    smallest = fam.fixed_bytes + sum(cheapest)
    too_small = [f"{spec} ({b} bytes)" for spec, b, _ in budgets if b < smallest]
    if too_small:  # refused before any measurement
        raise FidelityError(f"budget {', '.join(too_small)}: the smallest layout of these choices takes {smallest} bytes")


def _score_variants(run: InProcess, base: dict[str, str], groups: list[Group], variants: list[tuple[str, str]],
                    progress: bool) -> tuple[np.ndarray, dict[tuple[str, str], np.ndarray]]:
    """The base layout's per-context sums, and each (group, choice) variant's with the others at the base."""
    from tqdm import tqdm

    base_sum = run.score(base)
    sums: dict[tuple[str, str], np.ndarray] = {}
    units_of = {g.name: g.units for g in groups}
    for name, c in tqdm(variants, desc="allocate: effects", unit="variant", disable=not progress):
        sums[(name, c)] = run.score(with_group(base, units_of[name], c))
    return base_sum, sums


def _effect_rows(pm: PairedMeans, fam: Family, base: dict[str, str], groups: list[Group],
                 variants: list[tuple[str, str]], sums: dict[tuple[str, str], np.ndarray], base_sum: np.ndarray,
                 errors: dict[str, dict[str, float]]) -> list[EffectRow]:
    """One row per variant: its measured effect on the KLD, its bytes and its proxy."""
    units_of = {g.name: g.units for g in groups}
    effect_rows: list[EffectRow] = []
    for name, c in variants:
        units = units_of[name]
        eff = _estimate(pm, sums[(name, c)] - base_sum)
        effect_rows.append({"group": name, "choice": c, "delta_kld": eff,
                            "bytes": sum(fam.unit_bytes(u, c) for u in units),
                            "base_bytes": sum(fam.unit_bytes(u, base[u]) for u in units),
                            "proxy": group_proxy(errors, units, base, c)})
    return effect_rows


#: Per group, the knapsack's options: their bytes, their values (what the knapsack minimises), their names.
_Options = tuple[list[list[int]], list[list[float]], list[list[str]]]


def _options(fam: Family, base: dict[str, str], groups: list[Group], effect_rows: list[EffectRow], effects: str,
             scale: float) -> _Options:
    """Each group's options: ``base`` (value 0) and every measured choice, valued by its measured effect
    (``effects = "measured"``) or by its scaled proxy."""
    by_key = {(r["group"], r["choice"]): r for r in effect_rows}
    costs: list[list[int]] = []
    values: list[list[float]] = []
    opts: list[list[str]] = []
    for g in groups:
        o_costs = [sum(fam.unit_bytes(u, base[u]) for u in g.units)]
        o_vals = [0.0]
        o_names = ["base"]
        for c in fam.choices:
            r = by_key.get((g.name, c))
            if r is None:
                continue
            o_costs.append(r["bytes"])
            o_vals.append(r["delta_kld"]["value"] if effects == "measured" else scale * r["proxy"])
            o_names.append(c)
        costs.append(o_costs)
        values.append(o_vals)
        opts.append(o_names)
    return costs, values, opts


def _propose(run: InProcess, pm: PairedMeans, fam: Family, base: dict[str, str], groups: list[Group],
             options: _Options, budget_of: tuple[str, int, str], sums: dict[tuple[str, str], np.ndarray],
             base_sum: np.ndarray) -> Proposal:
    """The knapsack's layout for one budget ``(spec, bytes, what)``: predicted from the effects, then measured."""
    spec, budget, what = budget_of
    costs, values, opts = options
    picks = solve(costs, values, budget - fam.fixed_bytes)
    layout = dict(base)
    chosen: dict[str, str] = {}
    for g, o_names, k in zip(groups, opts, picks):
        chosen[g.name] = o_names[k]
        if o_names[k] != "base":
            layout = with_group(layout, g.units, o_names[k])
    measured_keys = [(g.name, chosen[g.name]) for g in groups if chosen[g.name] != "base"]
    predicted_sum = base_sum + sum((sums[k] - base_sum for k in measured_keys), np.zeros_like(base_sum))
    layout_sum = run.score(layout)
    return {
        "budget_spec": spec, "budget_bytes": budget, "budget_is": what,
        "groups": {g.name: (chosen[g.name] if chosen[g.name] != "base" else
                            _group_base(base, g.units)) for g in groups},
        "layout": dict(sorted(layout.items())),
        "predicted_bytes": layout_bytes(fam, layout),
        "predicted_delta_kld": _estimate(pm, predicted_sum - base_sum),
        "predicted_kld": _estimate(pm, predicted_sum, nonnegative=True),
        "objective": float(sum(v[k] for v, k in zip(values, picks))),
        "in_process_kld": _estimate(pm, layout_sum, nonnegative=True),
        "interaction": _estimate(pm, layout_sum - predicted_sum),
    }


def _result(req: AllocationRequest, suite: Suite, shards: list[int], pm: PairedMeans, groups: list[Group],
            base: dict[str, str], base_kld: TestedEstimate, effect_rows: list[EffectRow], proposals: list[Proposal],
            *, proxy: ProxyRecord, n_contexts: int, variants_scored: int, timing: TimingRecord) -> AllocationResult:
    """The search's JSON document (schema :data:`SCHEMA`)."""
    fam = req.family
    return {
        "schema": SCHEMA,
        "family": fam.name,
        "choices": list(fam.choices),
        "reference": str(req.reference),
        "suite": {"path": str(req.suite), "suite_token_sha256": suite.suite_token_sha256, "shards": shards},
        "n_contexts": n_contexts, "n_clusters": pm.n_clusters, "n_positions": int(pm.n_positions),
        "grouping": req.grouping,
        "groups": [{"name": g.name, "units": list(g.units)} for g in groups],
        "base": {"spec": req.base, "layout": dict(sorted(base.items())), "bytes": layout_bytes(fam, base),
                 "kld": base_kld},
        "fixed_bytes": fam.fixed_bytes,
        "effects_used": req.effects,
        "proxy": proxy,
        "additivity": ADDITIVITY,
        "effects": effect_rows,
        "proposals": proposals,
        "bootstrap": {"method": INTERVAL_METHOD, "method_text": INTERVAL_METHOD_TEXT, "level": 0.95,
                      "n_boot": req.n_boot, "seed": req.seed},
        "compute": {"device": req.device, "dtype": "float32", "capture": "LM-head input, in-process weight swaps"},
        "variants_scored": variants_scored,
        "timing": timing,
    }


def _group_base(base: dict[str, str], units: tuple[str, ...]) -> str:
    kinds = sorted({base[u] for u in units})
    return kinds[0] if len(kinds) == 1 else "base (" + "/".join(kinds) + ")"


def request_from_args(reference: Path, suite: Path, family: Family, base: str, budgets: str,
                      **kw: Unpack[RequestOptions]) -> AllocationRequest:
    """An :class:`AllocationRequest` from command-line text (``budgets`` comma-separated)."""
    specs = tuple(x.strip() for x in budgets.split(",") if x.strip())
    if not specs:
        raise FidelityError("--budget: expected one or more budgets (bytes, 'base' or a choice)")
    return AllocationRequest(reference=Path(reference), suite=Path(suite), family=family, base=base, budgets=specs, **kw)
