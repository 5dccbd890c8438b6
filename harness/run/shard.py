"""One shard, scored: load both captures, score every position, summarize into a shard report.

Both functions read one :class:`~harness.run.shard_inputs.ShardInputs` (suite, shard, stores,
heads, window). :func:`shard_positions` produces the per-position scores of a candidate x shard
(no window, no statistics); :func:`score_shard` turns them into a
:class:`~harness.reports.shard.ShardReport`. The pytest session and ``fidelity replay`` both go
through here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np

from harness.allocation.bits_per_weight import BitsPerWeight
from harness.errors import FidelityError
from harness.io.jsonio import JSONObject
from harness.metrics import ContextLabel
from harness.metrics.records import ShardSummary
from harness.metrics.scores import PositionScores
from harness.reports.shard import ShardReport, make_comparability
from harness.run.shard_inputs import LiveShardInputs, ShardInputs
from harness.run.shard_summary import shard_metrics
from harness.run.verify import check_scores_finite
from harness.scoring import streaming

if TYPE_CHECKING:
    import torch

    from harness.inputs.head import HeadTensor


def score_shard(
    inputs: ShardInputs | LiveShardInputs,
    *,
    reference_name: str = "reference",
    candidate_name: str,
    candidate_meta: CandidateMeta | None = None,
    n_boot: int = 10_000,
    device: str = "cpu",
    positions: ShardPositions | None = None,
    custody: JSONObject | None = None,
    metrics: ShardSummary | None = None,
) -> ShardReport:
    """Score one shard of verified ``inputs`` and build its :class:`~harness.reports.shard.ShardReport`
    (window: ``inputs.score_from``).

    ``custody``: the published digests of a dataset read in another layout (comparability ``custody``).

    ``positions`` (from :func:`shard_positions`) reuses already scored positions: the same
    capture summarized under another window needs no rescoring. ``metrics`` (from :func:`shard_metrics` of
    these positions, e.g. read from the summaries cache) reuses the statistics: nothing is summarized again.

    Hidden-state stores go through ``inputs.head`` (and ``inputs.cand_head`` for the candidate
    when given); logits stores are scored in logits mode (no head).
    """
    suite, shard, reference, candidate = inputs.suite, inputs.shard, inputs.reference, inputs.candidate
    score_from = inputs.score_from
    if positions is None:
        if not isinstance(inputs, ShardInputs):
            raise FidelityError(f"{inputs.candidate.root}: a candidate scored while captured is summarized from its "
                                "scored positions: expected them, found none")
        positions = shard_positions(inputs, device=device)
    pos = positions
    mode, head_sha, cand_head_sha = pos.mode, pos.head_sha256, pos.cand_head_sha256
    t2 = time.perf_counter()
    if metrics is None:
        metrics = shard_metrics(pos, score_from=score_from, n_boot=n_boot)
    t3 = time.perf_counter()
    comparability = make_comparability(
        suite_token_sha256=suite.suite_token_sha256,
        shard_index=shard,
        shard_sha256=suite.shard(shard).sha256,
        score_from=score_from,
        reference={"name": reference_name, "identity": reference.identity},
        candidate={"name": candidate_name, "identity": candidate.identity, **(candidate_meta or {})},
        head_sha256=head_sha,
        cand_head_sha256=cand_head_sha,
        engine={
            "reference": reference.manifest.get("engine"),
            "candidate": candidate.manifest.get("engine"),
            "candidate_runtime": candidate.manifest.get("runtime"),
        },
        scorer={**SCORER_SETTINGS, "mode": mode},
        custody=custody,
    )
    # how the logits were computed on this machine (backend, GEMM path): a fact of the run, not a
    # comparability field -- the paths agree to the documented tolerance, so shards scored on
    # different machines still aggregate
    ran = {f"scorer_{k}": v for k, v in pos.scorer_run.items()}
    return ShardReport(
        candidate=candidate_name,
        comparability=comparability,
        metrics=metrics,
        timing={"load_s": pos.load_s, "score_s": pos.score_s, "metrics_s": t3 - t2, "device": device, **ran},
    )


@dataclass
class ShardPositions:
    """The scored positions of one candidate x shard, before any window or statistic."""

    scores: PositionScores
    context_index: np.ndarray
    row: np.ndarray
    labels: list[ContextLabel]  # one per context of the shard
    mode: str
    head_sha256: str | None
    cand_head_sha256: str | None
    load_s: float = 0.0
    score_s: float = 0.0
    #: which backend and GEMM path computed the scores (:class:`harness.scoring.scorer.ScorerRun` as a dict)
    scorer_run: dict[str, str] = field(default_factory=dict)

    def content(self) -> dict[str, object]:
        """What every statistic of these positions is computed from (no timing): the key of a result kept by its
        inputs (:func:`harness.io.kept.kept`)."""
        return {"scores": self.scores, "context_index": self.context_index, "row": self.row, "labels": self.labels,
                "mode": self.mode, "head_sha256": self.head_sha256, "cand_head_sha256": self.cand_head_sha256}


def shard_positions(inputs: ShardInputs, *, device: str = "cpu") -> ShardPositions:
    """Load one shard of both captures and score every position (no window, no statistics)."""
    import torch

    from harness.scoring.scorer import score_hidden, score_logits, scorer_run

    suite, shard, reference, candidate = inputs.suite, inputs.shard, inputs.reference, inputs.candidate
    head, cand_head = inputs.head, inputs.cand_head

    # one side logits (llama.cpp), the other hidden states (transformers, vLLM), in either role: the
    # hidden-state side's logits are formed through its head (the shared head; a candidate's own head
    # when given), fp32 like the scorer, and both are scored in logits mode
    for store in (reference, candidate):
        if store.kind not in ("hidden_states", "logits"):
            raise FidelityError(f"{store.root}: store kind {store.kind!r} cannot be scored (hidden_states or logits)")
    mixed = reference.kind != candidate.kind
    head_sha: str | None
    cand_head_sha: str | None
    t0 = time.perf_counter()
    indices = list(suite.shard_indices(shard))
    rows_per = suite.n_ctx - 1
    targets = torch.from_numpy(suite.tokens[indices, 1:].astype(np.int64).reshape(-1))
    if reference.kind != "logits" and not mixed and streaming.streams(len(indices), rows_per, reference.width):
        # large shard: prefetch the next contexts while the current ones are scored (bounded memory)
        head = _shared_head(inputs)
        probe = torch.empty(0, reference.width, dtype=getattr(torch, reference.dtype))
        cprobe = torch.empty(0, candidate.width, dtype=getattr(torch, candidate.dtype))
        ran = scorer_run(probe, cprobe, head.weight, None if cand_head is None else cand_head.weight, device=device).as_dict()
        scores, wait_s, score_s = streaming.score_hidden_streaming(
            reference, candidate, indices, targets, head.weight,
            None if cand_head is None else cand_head.weight, device=device,
        )
        mode, head_sha = "hidden_states", head.sha256
        cand_head_sha = None if cand_head is None else cand_head.sha256
        context_index = np.repeat(np.asarray(indices, dtype=np.int64), rows_per)
        row = np.tile(np.arange(rows_per, dtype=np.int64), len(indices))
        labels = [ContextLabel(index=c.index, source_cluster=c.source_cluster, stratum=c.stratum)
                  for c in (suite.contexts[i] for i in indices)]
        check_scores_finite(scores.kld, context_index, row, reference, candidate, head, cand_head)
        return ShardPositions(scores, context_index, row, labels, mode, head_sha, cand_head_sha, wait_s, score_s, ran)
    ref = reference.load_rows(indices)
    cnd = candidate.load_rows(indices)
    t1 = time.perf_counter()
    if mixed:
        if reference.kind == "hidden_states":
            head = _shared_head(inputs)
            ref, path = _through_head(ref, head.weight)
            mode, head_sha, cand_head_sha = "logits (reference through head)", head.sha256, None
        else:
            through = cand_head if cand_head is not None else _shared_head(inputs)
            cnd, path = _through_head(cnd, through.weight)
            own = cand_head is not None
            mode = "logits (candidate through its own head)" if own else "logits (candidate through head)"
            head_sha, cand_head_sha = (None, through.sha256) if own else (through.sha256, None)
        scores = score_logits(ref, cnd, targets)
        ran = {"backend": "torch (logits mode)", "gemm": path}
    elif reference.kind == "logits":
        scores = score_logits(ref, cnd, targets)
        mode, head_sha, cand_head_sha = "logits", None, None
        ran = {"backend": "torch (logits mode)", "gemm": "none"}
    else:
        head = _shared_head(inputs)
        ran = scorer_run(ref, cnd, head.weight, None if cand_head is None else cand_head.weight, device=device).as_dict()
        scores = score_hidden(
            ref, cnd, head.weight, targets,
            cand_head=None if cand_head is None else cand_head.weight,
            device=device,
        )
        mode, head_sha = "hidden_states", head.sha256
        cand_head_sha = None if cand_head is None else cand_head.sha256
    t2 = time.perf_counter()
    context_index = np.repeat(np.asarray(indices, dtype=np.int64), rows_per)
    row = np.tile(np.arange(rows_per, dtype=np.int64), len(indices))
    labels = [ContextLabel(index=c.index, source_cluster=c.source_cluster, stratum=c.stratum)
              for c in (suite.contexts[i] for i in indices)]
    check_scores_finite(scores.kld, context_index, row, reference, candidate, head, cand_head)
    return ShardPositions(scores, context_index, row, labels, mode, head_sha, cand_head_sha, t1 - t0, t2 - t1, ran)


def _shared_head(inputs: ShardInputs) -> HeadTensor:
    """The shared head, which a hidden-state store needs (the joins have checked it is given)."""
    if inputs.head is None:
        raise FidelityError(f"{inputs.reference.root}: a hidden-state store is scored through the shared head: "
                            "expected a head, found none")
    return inputs.head


def _through_head(hidden: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, str]:
    """fp32 logits ``hidden @ weight.T`` of a hidden-state side scored in logits mode, with the GEMM
    path the scorer uses on the CPU (returned with the logits, for the report's timing block)."""
    import torch

    from harness.scoring.gemm import gemm_mode
    from harness.scoring.torch_path import gemm_operand, gemm_path, logits_gemm

    cpu = torch.device("cpu")
    path = gemm_path(cpu, hidden, weight)
    with torch.inference_mode(), gemm_mode(path):
        w = gemm_operand(weight, cpu, path)
        out = logits_gemm(hidden, w, torch.empty(hidden.shape[0], w.shape[0], dtype=torch.float32))
    return out, path


class CandidateMeta(TypedDict):
    """What a shard report says about its candidate beyond its identity."""

    #: On-disk size in bytes (None when unknown).
    size_bytes: int | None
    #: The candidate's tags from ``fidelity.toml``.
    tags: list[str]
    #: Bits per weight of its checkpoint (:mod:`harness.allocation.bits_per_weight`; None when unknown).
    bits_per_weight: NotRequired[BitsPerWeight | None]


#: Scorer settings that decide the numbers (tiling does not, so it is not recorded here).
#: The backend and GEMM path that ran (they agree to the documented tolerance) are in the report's timing block.
SCORER_SETTINGS = {"method": "exact full-vocabulary", "gemm": "head dtype operands, fp32 logits", "softmax_dtype": "float32"}
