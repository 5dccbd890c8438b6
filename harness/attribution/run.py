"""``fidelity attribute`` end to end: load, make groups, score every variant, compute the effects.

Nothing is written here; :func:`harness.attribution.render.write_attribution` writes the result
(all files at the end, each atomically).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.attribution.effects import (
    INTERVAL_METHOD,
    INTERVAL_METHOD_TEXT,
    GroupData,
    PairedMeans,
    grouping_effects,
)
from harness.attribution.groups import Grouping, fused_experts, make_groupings
from harness.attribution.sizes import folder_tensor_bytes, unit_bytes
from harness.engines.identity import model_identity
from harness.errors import FidelityError
from harness.inputs.suite import Suite

SCHEMA = "fidelity.attribution/1"
MODES = ("restore", "only")


@dataclass(frozen=True)
class AttributionRequest:
    """What to attribute: models, suite and shards, groupings, modes, statistics and compute settings."""

    reference: Path
    candidate: Path
    suite: Path
    shards: str | None = None
    by: tuple[str, ...] = ("layer", "kind")
    globs: tuple[str, ...] = ()
    modes: tuple[str, ...] = MODES
    n_boot: int = 10_000
    seed: int = 20240601
    device: str = "cpu"
    dtype: str = "float32"
    progress: bool = True


def attribute(req: AttributionRequest) -> dict[str, Any]:
    """Run the attribution and return its JSON-ready result (schema :data:`SCHEMA`)."""
    from tqdm import tqdm

    from harness.attribution.ablation import (
        capture_reference,
        load_models,
        routing_counts,
        score_variant,
    )

    bad = [m for m in req.modes if m not in MODES]
    if bad or not req.modes:
        raise FidelityError(f"--modes: expected a subset of {', '.join(MODES)}, found {', '.join(req.modes) or 'nothing'}")
    t0 = time.perf_counter()
    suite = Suite.load(req.suite, verify=True)
    shards = suite.parse_shards(req.shards)
    indices = suite.context_indices(shards)
    tokens = np.asarray(suite.tokens[indices])
    models = load_models(req.reference, req.candidate, device=req.device, dtype=req.dtype)
    if int(models.model.get_output_embeddings().weight.shape[0]) < suite.vocab_size:  # type: ignore[operator]
        raise FidelityError(f"{req.candidate}: model vocab is smaller than the suite's tokenizer vocab {suite.vocab_size}")
    experts = {p: int(models.ref_values[p].shape[0]) for p in models.params if fused_experts(p) and models.ref_values[p].ndim == 3}
    groupings = make_groupings(models.params, req.by, req.globs, experts)
    cand_stored = folder_tensor_bytes(req.candidate)
    ref_stored = folder_tensor_bytes(req.reference)
    candidate_bytes = sum(cand_stored.values())

    def universe(g: Grouping) -> set[str]:  # every unit, at the grouping's granularity (expert slices or whole)
        return {u for grp in g.groups for u in grp.params} if g.rule == "expert" else set(models.params)

    variants: dict[frozenset[str], str] = {frozenset(): "candidate"}
    for g in groupings:
        for grp in g.groups:
            if "restore" in req.modes:
                variants.setdefault(frozenset(grp.params), f"{g.rule} {grp.name}: restore")
            if "only" in req.modes:
                variants.setdefault(frozenset(universe(g) - set(grp.params)), f"{g.rule} {grp.name}: only")
    t1 = time.perf_counter()
    ref = capture_reference(models, tokens)
    routing = routing_counts(models, tokens) if any(g.rule == "expert" for g in groupings) else {}
    sums: dict[frozenset[str], Any] = {}
    bar = tqdm(list(variants.items()), desc="attribute", unit="variant", disable=not req.progress)
    for restored, label in bar:
        bar.set_postfix_str(label[:40])
        sums[restored] = score_variant(models, ref, tokens, sorted(restored))
    t2 = time.perf_counter()

    positions = np.full(len(indices), suite.n_ctx - 1, dtype=np.int64)
    pm = PairedMeans([suite.contexts[i].source_cluster for i in indices], positions, n_boot=req.n_boot, seed=req.seed)
    cand = sums[frozenset()]
    out_groupings = []
    for g in groupings:
        data = []
        for grp in g.groups:
            only_key = frozenset(universe(g) - set(grp.params))
            data.append(GroupData(
                name=grp.name, params=grp.params,
                bytes=sum(unit_bytes(cand_stored, u, experts) for u in grp.params),
                reference_bytes=sum(unit_bytes(ref_stored, u, experts) for u in grp.params),
                restore_sum_kld=sums[frozenset(grp.params)].sum_kld if "restore" in req.modes else cand.sum_kld,
                only_sum_kld=sums[only_key].sum_kld if "only" in req.modes else None,
            ))
        eff = grouping_effects(pm, cand.sum_kld, g.rule, g.partition, data, candidate_bytes)
        if g.rule == "expert":
            add_routing(eff["groups"], routing, int(pm.n_positions))
        if "restore" not in req.modes:
            for row in eff["groups"]:
                row.pop("restore", None)
            eff["additivity"] = None
            eff["bits_to_spend"] = []
        out_groupings.append(eff)

    return {
        "schema": SCHEMA,
        "reference": {"path": str(req.reference), "identity": model_identity(req.reference)},
        "candidate": {"path": str(req.candidate), "identity": model_identity(req.candidate), "stored_bytes": candidate_bytes},
        "suite": {"path": str(req.suite), "suite_token_sha256": suite.suite_token_sha256, "shards": shards},
        "n_contexts": len(indices),
        "n_clusters": pm.n_clusters,
        "n_positions": int(pm.n_positions),
        "differing_params": len(models.params),
        "modes": list(req.modes),
        "compute": {"device": req.device, "dtype": req.dtype, "capture": "LM-head input, in-process weight swaps"},
        "bootstrap": {"method": INTERVAL_METHOD, "method_text": INTERVAL_METHOD_TEXT, "level": 0.95, "n_boot": req.n_boot, "seed": req.seed},
        "whole": pm.estimate(cand.sum_kld, nonnegative=True),
        "top1_candidate": float(cand.top1.sum() / pm.n_positions),
        "variants_scored": len(variants) + 1,
        "groupings": out_groupings,
        "timing": {"load_s": t1 - t0, "variants_s": t2 - t1, "total_s": time.perf_counter() - t0},
    }


def add_routing(rows: list[dict[str, Any]], routing: dict[int, np.ndarray], n_positions: int) -> None:
    """Put each expert group's routing frequency on the suite into its row: ``routing`` = ``picks`` (how
    often the layer's router put the expert among its top-k over the scored positions), ``share`` (of the
    layer's picks; 1 / experts when balanced) and ``positions`` (the share of scored positions routed to it)."""
    for row in rows:
        words = row["group"].split()
        if len(words) != 4 or words[0] != "layer" or words[2] != "expert" or int(words[1]) not in routing:
            continue
        counts = routing[int(words[1])]
        picks, total = int(counts[int(words[3])]), int(counts.sum())
        row["routing"] = {"picks": picks, "share": picks / total if total else None,
                          "positions": picks / n_positions if n_positions else None}


def parse_by(text: str) -> tuple[str, ...]:
    """``"layer,kind"`` -> ``("layer", "kind")``; empty entries dropped."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def request_from(reference: Path, candidate: Path, suite: Path, **kw: Any) -> AttributionRequest:
    """An :class:`AttributionRequest` with keyword overrides (``by`` may be a comma-separated string)."""
    if isinstance(kw.get("by"), str):
        kw["by"] = parse_by(kw["by"])
    for k in ("globs", "modes"):
        if k in kw and not isinstance(kw[k], tuple):
            kw[k] = parse_by(kw[k]) if isinstance(kw[k], str) else tuple(kw[k])
    return AttributionRequest(reference=Path(reference), candidate=Path(candidate), suite=Path(suite), **kw)

