"""The published tool's method, reproduced on request so a published figure can be checked to its digits.

Reasoning: docs/interchange.md §"The published method, on request".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.inputs.interchange_layout import REPORT_FULL, REPORT_WINDOWED
from harness.interchange.bootstrap_method import percentile_bootstrap
from harness.interchange.report_format import bin_edges, identity_block, tail_block, window_block
from harness.io.md_table import md_table

if TYPE_CHECKING:
    import torch

    from harness.capture.store import CaptureStore
    from harness.inputs.head import HeadTensor
    from harness.inputs.suite import Suite
    from harness.reports.shard import ShardReport

#: The published tool's vocabulary chunk (its ``--vocab-chunk`` default).
VOCAB_CHUNK = 24_832
METHOD_TEXT = ("published method (tools/fidelity.py replay of the published fidelity datasets): logits = bf16 "
               "operands' product rounded to bf16 (two passes); float32 normalizers; per-position KL/JSD summed in float32 per "
               "24,832-token vocabulary chunk, chunks added in float64; percentile source-cluster bootstrap over "
               "context means (random.Random(1), 10,000 replicates, clusters in order of first appearance)")


@dataclass(frozen=True)
class MethodScores:
    """Per-position scores of one context by the published method (float64 arrays, one entry per scored row)."""

    kld: np.ndarray
    jsd_bits: np.ndarray
    top1: np.ndarray


def bf16_logits(hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """The product of the bf16 operands as torch returns it (bf16: fp32 accumulation rounded to bf16), as float32."""
    return (hidden @ head.T).float()


def _normalizers(hidden: torch.Tensor, head: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass one: float32 log-normalizers (log-sum-exp per chunk, combined with logaddexp) and the first maximal logit."""
    import torch

    rows = hidden.shape[0]
    log_z = torch.full((rows,), -math.inf, dtype=torch.float32)
    top_val = torch.full((rows,), -math.inf, dtype=torch.float32)
    top_id = torch.zeros((rows,), dtype=torch.int64)
    for v0 in range(0, head.shape[0], chunk):
        logits = bf16_logits(hidden, head[v0:v0 + chunk])
        log_z = torch.logaddexp(log_z, torch.logsumexp(logits, dim=-1))
        val, idx = logits.max(dim=-1)
        better = val > top_val  # a later chunk wins only with a strictly larger logit: the first maximum overall
        top_val = torch.where(better, val, top_val)
        top_id = torch.where(better, idx + v0, top_id)
    return log_z, top_id


def score_rows(ref: torch.Tensor, cand: torch.Tensor, head: torch.Tensor, cand_head: torch.Tensor | None = None,
               chunk: int = VOCAB_CHUNK) -> MethodScores:
    """Published-method scores of ``ref`` vs ``cand`` hidden rows (bf16 ``[rows, hidden]``, one context)."""
    import torch

    ch = head if cand_head is None else cand_head
    with torch.inference_mode():
        rz, rtop = _normalizers(ref, head, chunk)
        cz, ctop = _normalizers(cand, ch, chunk)
        kl = torch.zeros(ref.shape[0], dtype=torch.float64)
        js = torch.zeros(ref.shape[0], dtype=torch.float64)
        for v0 in range(0, head.shape[0], chunk):  # pass two: the divergences
            rl = bf16_logits(ref, head[v0:v0 + chunk]) - rz[:, None]
            cl = bf16_logits(cand, ch[v0:v0 + chunk]) - cz[:, None]
            p, q = rl.exp(), cl.exp()
            kl += (p * (rl - cl)).sum(-1).double()
            logm = (0.5 * (p + q)).clamp_min(1e-30).log()
            js += (0.5 * (p * (rl - logm)).sum(-1) + 0.5 * (q * (cl - logm)).sum(-1)).double()
    return MethodScores(kl.numpy(), (js / math.log(2.0)).numpy(), (rtop == ctop).numpy())


def lower_median(values: np.ndarray) -> float:
    """The lower of the two middle values (torch's ``median``), the published per-context median."""
    return float(np.sort(values)[(values.size - 1) // 2])


def method_report(*, suite: Suite, shard: int, reference: CaptureStore, candidate: CaptureStore, head: HeadTensor,
                  exact: ShardReport, view_digest: str, score_from: int = 0, cand_head: HeadTensor | None = None,
                  samples: int = 10_000, seed: int = 1) -> dict[str, Any]:
    """One shard by the published method, in the published schema, with the exact figures beside it."""
    per_ctx: list[dict[str, Any]] = []
    per_all: list[dict[str, Any]] = []
    all_kl, hits, positions = [], 0, 0
    for i in suite.shard_indices(shard):
        c = suite.contexts[i]
        s = score_rows(reference.load(i)[score_from:], candidate.load(i)[score_from:], head.weight,
                       None if cand_head is None else cand_head.weight)
        n = int(s.kld.size)
        mean, med, agree = float(s.kld.mean()), lower_median(s.kld), int(s.top1.sum()) / n
        per_ctx.append({"index": i, "stratum": c.stratum, "source_cluster": str(c.source_cluster), "mean_kld": mean,
                        "median_kld": med, "max_kld": float(s.kld.max()), "mean_jsd_bits": float(s.jsd_bits.mean()),
                        "top1_agreement": agree})
        per_all.append({"index": i, "source_cluster": str(c.source_cluster), "stratum": c.stratum, "positions_scored": n,
                        "mean_kld": mean, "median_kld": med, "top1_agreement": agree})
        all_kl.append(s.kld)
        hits += int(s.top1.sum())
        positions += n
    kl = np.concatenate(all_kl)
    q = {name: float(np.quantile(kl, p)) for name, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999))}
    edges = np.asarray(bin_edges())
    counts = np.bincount(np.searchsorted(edges, kl, side="right"), minlength=edges.size + 1)
    means = [r["mean_kld"] for r in per_ctx]
    strata: dict[str, list[float]] = {}
    for r in per_ctx:
        strata.setdefault(r["stratum"], []).append(r["mean_kld"])
    token_mean, top1 = float(kl.mean()), hits / positions
    comp, m = exact.comparability, exact.metrics
    ex_mean, ex_top1 = float(m["kld"]["mean"]), float(m["top1"]["agreement"])
    ex: dict[str, Any] = {"token_mean_kld": ex_mean, "ci95": m["kld"]["ci95"], "context_macro_mean_kld": m["kld"]["mean_context_macro"],
          "top1_agreement": m["top1"]["agreement"], "p99_kld": m["kld"]["p99"], "max_kld": m["kld"]["max"],
          "interval_method": m["bootstrap"]["method_text"]}
    boot = percentile_bootstrap(means, [r["source_cluster"] for r in per_ctx], samples, seed)
    return {
        "schema": REPORT_WINDOWED if score_from else REPORT_FULL,
        "reference": f"fidelity:{comp['reference']['name']}", "candidate": f"fidelity:{comp['candidate']['name']}",
        "reference_identity": identity_block(comp["reference"]["identity"]),
        "candidate_identity": identity_block(comp["candidate"]["identity"]),
        "head": str(head.path), "head_sha256": head.sha256,
        "candidate_head": None if cand_head is None else str(cand_head.path),
        "candidate_head_sha256": None if cand_head is None else cand_head.sha256,
        "suite_token_sha256": view_digest, "filter": "all",
        "scored_position_window": window_block(score_from, suite.n_ctx, len(per_ctx)),
        "contexts": len(per_ctx), "scored_positions": positions, "vocab_size": head.vocab_size, "hidden_size": head.hidden_size,
        "token_mean_kld": token_mean, "token_median_kld": q["p50"], "p95_kld": q["p95"], "p99_kld": q["p99"],
        "p999_kld": q["p999"], "max_kld": float(kl.max()),
        "kld_tail": tail_block([int(x) for x in counts], positions, float(kl.max()), float(kl.min()), q),
        "context_macro_mean_kld": statistics.fmean(means), "context_bootstrap": boot,
        "mean_jsd_bits": statistics.fmean(r["mean_jsd_bits"] for r in per_ctx), "top1_agreement": top1,
        "strata": {k: {"contexts": len(v), "mean_kld": statistics.fmean(v)} for k, v in sorted(strata.items())},
        "worst_contexts": sorted(per_ctx, key=lambda c: -c["mean_kld"])[:20],
        "per_context_all": per_all, "per_context": per_ctx,
        "comparator": {"vocab_chunk": VOCAB_CHUNK, "device": "cpu", "accumulation": "float64", "two_pass": True},
        "fidelity_method": {"name": "published", "text": METHOD_TEXT, "exact": ex,
                            "difference": {"token_mean_kld": token_mean - ex_mean,
                                           "token_mean_kld_relative": (token_mean - ex_mean) / ex_mean if ex_mean else None,
                                           "top1_agreement": top1 - ex_top1},
                            "custody": comp.get("custody")},
    }


def render_method_markdown(doc: dict[str, Any]) -> str:
    """A short page: the published-method figures, the exact figures of the same positions, the difference."""
    ex, d = doc["fidelity_method"]["exact"], doc["fidelity_method"]["difference"]
    boot = doc["context_bootstrap"]
    ci = ex["ci95"]
    rel = d["token_mean_kld_relative"]
    lines = [
        f"# {doc['candidate']} vs {doc['reference']}: published method (not this project's measurement)", "",
        doc["fidelity_method"]["text"] + ".", "",
        *md_table(["figure", "published method", "exact (this project)", "difference"], [
            ["token mean KLD", f"{doc['token_mean_kld']:.6f}", f"{ex['token_mean_kld']:.6f}",
             f"{d['token_mean_kld']:+.6f}" + (f" ({100 * rel:+.1f}%)" if rel is not None else "")],
            ["95% interval", f"[{boot['ci95_low']:.6f}, {boot['ci95_high']:.6f}] (percentile, context means)",
             (f"[{ci[0]:.6f}, {ci[1]:.6f}]" if ci else "not estimable") + f" ({ex['interval_method']})", ""],
            ["top-1 agreement", f"{doc['top1_agreement']:.4f}", f"{ex['top1_agreement']:.4f}",
             f"{d['top1_agreement']:+.4f}"],
            ["context macro mean", f"{doc['context_macro_mean_kld']:.6f}", f"{ex['context_macro_mean_kld']:.6f}", ""],
        ]), "",
        f"{doc['contexts']} contexts, {doc['scored_positions']} positions, score_from "
        f"{doc['scored_position_window']['score_from']}; schema {doc['schema']}.", "",
    ]
    return "\n".join(lines)
