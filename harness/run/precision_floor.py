"""The precision floor: how far the reference capture's own arithmetic is from a higher-precision
forward of the same weights.

Reasoning: docs/statistics.md §"How the floor is measured".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np

from harness.capture.store import CaptureStore
from harness.engines.identity import model_identity
from harness.engines.transformers import head_inputs, load_model
from harness.errors import FidelityError
from harness.inputs.head import load_head
from harness.inputs.suite import Suite
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.jsonio import JSONObject
from harness.io.md_table import md_table
from harness.metrics import ContextLabel, summarize
from harness.metrics.scores import PositionScores
from harness.run.verify import check_reference_identity

__all__ = ["SCHEMA", "DEFINITION", "COMPUTE_DTYPES", "precision_floor", "render_precision_floor", "write_precision_floor"]

SCHEMA = "fidelity.precision-floor/1"


class FloorKld(TypedDict):
    """The floor's KLD: mean with its cluster-bootstrap interval (None: not estimable), median, p99, max."""

    mean: float
    ci95: list[float] | None
    median: float
    p99: float
    max: float


class FloorBootstrap(TypedDict):
    """How the interval was drawn."""

    method: str
    method_text: str
    n_boot: int
    seed: int


class PrecisionFloor(TypedDict):
    """``precision_floor.json``: what was measured against what (docs/statistics.md §"How the floor is measured"), and the result."""

    schema: str
    definition: str
    reference: JSONObject
    model: JSONObject
    head: JSONObject
    compute: dict[str, str]
    suite: JSONObject
    n_positions: int
    n_contexts: int
    n_clusters: int
    kld: FloorKld
    kld_rev_mean: float
    top1: float
    bootstrap: FloorBootstrap
    timing: dict[str, float]
    #: the window: each context's first ``score_from`` rows are not scored (as in the ladder)
    score_from: NotRequired[int]
    #: how the measured contexts were chosen (:mod:`harness.run.floor_cache`); absent: every context of the shards
    sample: NotRequired[JSONObject]

DEFINITION = ("mean KL(P_capture || P_high): the committed bf16 reference capture against a forward of the same "
              "bf16 weight values in higher-precision compute, both through the shared head")
#: The compute dtypes of the high-precision forward.
COMPUTE_DTYPES = ("float64", "float32")
#: Contexts per forward pass.
BATCH = 8



def precision_floor(*, suite_path: str | Path, model_dir: str | Path, store_path: str | Path, head_path: str | Path,
                    shards: str | None = None, dtype: str = "float64", n_boot: int = 10_000,
                    contexts: Sequence[int] | None = None, score_from: int = 0) -> PrecisionFloor:
    """Measure the precision floor of a reference capture (docs/statistics.md §"How the floor is measured"); returns the JSON-ready result.
    ``contexts``: measure only these context indices of ``shards`` (a sample; default: all of them);
    ``score_from``: drop each context's first rows, as the ladder's window does."""
    import torch

    from harness.scoring.gemm import gemm_mode
    from harness.scoring.torch_path import gemm_operand, gemm_path, logits_gemm, score_logits

    if dtype not in COMPUTE_DTYPES:
        raise FidelityError(f"--dtype: expected one of {', '.join(COMPUTE_DTYPES)}, found {dtype!r}")
    t0 = time.perf_counter()
    suite = Suite.load(suite_path, verify=True)
    store = CaptureStore.open(store_path, suite)
    if store.kind != "hidden_states":
        raise FidelityError(f"{store.root}: the precision floor needs a hidden-state reference store, found kind {store.kind!r}")
    head = load_head(head_path)
    check_reference_identity(store, reference_model=Path(model_dir), head=head)
    shard_list = suite.parse_shards(shards)
    indices = suite.context_indices(shard_list)
    if contexts is not None:
        outside = sorted(set(contexts) - set(indices))
        if outside:
            raise FidelityError(f"precision floor: contexts {outside[:5]} are not in shards {shards}")
        indices = sorted(contexts)
    tdtype = getattr(torch, dtype)
    model = load_model(model_dir, device="cpu", dtype="bfloat16").to(tdtype)
    model_config: Any = getattr(model, "config", None)
    if tdtype == torch.float64 and getattr(model_config, "_experts_implementation", None) not in (None, "eager"):
        # torch's grouped_mm (transformers' default for mixture-of-experts layers) has no float64 kernel: the
        # experts' own per-expert loop computes the same sums (the setter reaches every sub-configuration).
        model_config._experts_implementation = "eager"
    w_hi = head.weight.to(tdtype)
    cpu = torch.device("cpu")
    path = gemm_path(cpu, head.weight)
    w_ref = gemm_operand(head.weight, cpu)
    t1 = time.perf_counter()
    parts: list[PositionScores] = []
    rows = suite.n_ctx - 1
    for i in range(0, len(indices), BATCH):
        chunk = indices[i : i + BATCH]
        toks = np.asarray(suite.tokens[chunk], dtype=np.int64)
        ids = torch.from_numpy(toks)
        hi = head_inputs(model, ids)[:, :-1].reshape(-1, w_hi.shape[1])
        with torch.inference_mode():
            hi_logits = (hi @ w_hi.t()).float()
            ref_hidden = store.load_rows(chunk)
            with gemm_mode(path):
                ref_logits = logits_gemm(ref_hidden, w_ref, torch.empty(ref_hidden.shape[0], w_ref.shape[0], dtype=torch.float32))
        targets = torch.from_numpy(toks[:, 1:].reshape(-1))
        parts.append(score_logits(ref_logits, hi_logits, targets))
    t2 = time.perf_counter()
    scores = PositionScores.concat(parts)
    ci = np.repeat(np.asarray(indices, dtype=np.int64), rows)
    row = np.tile(np.arange(rows, dtype=np.int64), len(indices))
    labels = [ContextLabel(c.index, c.source_cluster, c.stratum) for c in (suite.contexts[j] for j in indices)]
    m = summarize(scores, ci, row, labels, score_from=score_from, n_boot=n_boot)
    k = m["kld"]
    return {
        "schema": SCHEMA,
        "definition": DEFINITION,
        "reference": {"store": str(store_path), "identity": store.identity},
        "model": {"path": str(model_dir), "identity": model_identity(model_dir)},
        "head": {"path": str(head_path), "sha256": head.sha256},
        "compute": {"dtype": dtype, "device": "cpu", "reference_logits_gemm": path},
        "suite": {"path": str(suite_path), "suite_token_sha256": suite.suite_token_sha256, "shards": list(shard_list)},
        "score_from": score_from,
        "n_positions": m["n_positions"],
        "n_contexts": m["n_contexts"],
        "n_clusters": m["n_clusters"],
        "kld": {"mean": k["mean"], "ci95": k["ci95"], "median": k["median"], "p99": k["p99"], "max": k["max"]},
        "kld_rev_mean": m["diagnostics"]["kld_rev"]["mean"],
        "top1": m["top1"]["agreement"],
        "bootstrap": {"method": m["bootstrap"]["method"], "method_text": m["bootstrap"]["method_text"],
                      "n_boot": m["bootstrap"]["n_boot"], "seed": m["bootstrap"]["seed"]},
        "timing": {"load_s": t1 - t0, "forward_and_score_s": t2 - t1, "total_s": time.perf_counter() - t0},
    }


def _fmt(x: float) -> str:
    return f"{x:.3e}" if (x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e4)) else f"{x:.4f}"


def render_precision_floor(r: PrecisionFloor) -> str:
    """Markdown of a precision-floor result."""
    k = r["kld"]
    ci = f"[{_fmt(k['ci95'][0])}, {_fmt(k['ci95'][1])}]" if k["ci95"] else "not estimable"
    return "\n".join([
        "# Precision floor of the reference",
        "",
        f"Definition: {r['definition']} ({r['compute']['dtype']} compute).",
        "",
        *md_table(["positions", "contexts", "clusters", "mean KLD [95% CI]", "median", "p99", "max", "top-1"],
                  [[r["n_positions"], r["n_contexts"], r["n_clusters"], f"{_fmt(k['mean'])} {ci}", _fmt(k["median"]),
                    _fmt(k["p99"]), _fmt(k["max"]), f"{r['top1']:.4f}"]]),
        "",
        f"Interval: {r['bootstrap']['method_text']}, {r['bootstrap']['n_boot']} replicates, seed {r['bootstrap']['seed']}.",
        "",
        f"Contexts: {r['sample']['text'] if 'sample' in r else 'every context of the shards'}; "
        f"window score_from={r.get('score_from', 0)}.",
        "",
        "A candidate's KLD holds its weight error and the rounding noise of both forwards, which changes with",
        "the weights; this floor is the scale below which a KLD cannot be told from the reference's own",
        "arithmetic, not an amount to subtract. The cross-engine floor compares two bf16 forwards and cannot see",
        "the rounding every bf16 engine shares.",
        "",
    ])


def write_precision_floor(result: PrecisionFloor, out_dir: str | Path) -> list[Path]:
    """Write ``precision_floor.json`` and ``precision_floor.md`` into ``out_dir`` as one unit."""
    out = Path(out_dir)
    files = {out / "precision_floor.json": dumps_json(result), out / "precision_floor.md": render_precision_floor(result)}
    atomic_write_files(files)
    return list(files)
