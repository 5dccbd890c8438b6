"""The scorer's entry point: check the inputs, choose a backend, score.

:func:`score_hidden` dispatches to the tiled torch path (:mod:`harness.scoring.torch_path`, any
device) or the fused Triton kernel (:mod:`harness.scoring.fused_kl`, CUDA). The per-position
outputs are :class:`harness.metrics.scores.PositionScores`. Logits mode, the benchmark's
reference methods and the GEMM helpers live in :mod:`harness.scoring.torch_path` and are
re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.metrics.scores import PositionScores
from harness.scoring.backends import choose_backend
from harness.scoring.torch_path import (
    MEMORY_BUDGET_BYTES,
    bare_gemms,
    check_hidden_inputs,
    default_tile_rows,
    gemm_operand,
    gemm_path,
    logits_gemm,
    score_hidden_tiled,
    score_logits,
    score_two_pass,
    shard_tiles,
)

__all__ = [
    "MEMORY_BUDGET_BYTES",
    "PositionScores",
    "ScorerRun",
    "bare_gemms",
    "default_tile_rows",
    "gemm_operand",
    "logits_gemm",
    "score_hidden",
    "score_logits",
    "score_two_pass",
    "scorer_run",
    "shard_tiles",
]


@dataclass(frozen=True)
class ScorerRun:
    """How :func:`score_hidden` computes a given call: what a report records as the path that ran."""

    backend: str  #: "torch" (tiled path) or "triton" (fused kernel; rows that overflow are rescored by torch)
    gemm: str  #: the logits GEMM: a :data:`harness.scoring.gemm.GEMM_PATHS` value, or "triton-dot" (bf16 tl.dot, fp32 accumulate)

    def as_dict(self) -> dict[str, str]:
        return {"backend": self.backend, "gemm": self.gemm}


def scorer_run(
    ref_hidden: torch.Tensor,
    cand_hidden: torch.Tensor,
    head: torch.Tensor,
    cand_head: torch.Tensor | None = None,
    *,
    device: str | torch.device | None = None,
    backend: str | None = None,
) -> ScorerRun:
    """The backend and GEMM path :func:`score_hidden` takes for these arguments (the same decision it makes)."""
    dev = torch.device(device) if device is not None else head.device
    if choose_backend(backend, dev) == "triton":
        return ScorerRun("triton", "triton-dot")
    return ScorerRun("torch", gemm_path(dev, ref_hidden, cand_hidden, head, cand_head))


def score_hidden(
    ref_hidden: torch.Tensor,
    cand_hidden: torch.Tensor,
    head: torch.Tensor,
    targets: torch.Tensor,
    cand_head: torch.Tensor | None = None,
    *,
    tile_rows: int | None = None,
    chunk_rows: int | None = None,
    device: str | torch.device | None = None,
    threads: int | None = None,
    backend: str | None = None,
    compiled: bool | None = None,
) -> PositionScores:
    """Score hidden states ``[N, H]`` through the LM head ``[V, H]`` (candidate through ``cand_head`` if given).

    ``backend``: ``"torch"`` (the tiled path), ``"triton"`` (the fused kernel: one pass for
    KL/top-1/NLL, a second for JSD/EAR), or ``None``/``"auto"``: triton on CUDA when triton
    imports, torch elsewhere. The environment variable ``FIDELITY_SCORER_BACKEND``
    (torch|triton|auto) overrides ``None``. The two paths agree per position to
    |delta KL| <= 1e-6 + 1e-4 KL (GEMM summation order only). ``compiled``: the torch path's metric pass
    (:func:`harness.scoring.torch_path.tile_plan`; None: its choice for these rows).
    """
    n, _vocab, dev, t_all = check_hidden_inputs(ref_hidden, cand_hidden, head, targets, cand_head, device)
    if n and choose_backend(backend, dev) == "triton":
        from harness.scoring.fused_kl import fused_score

        return fused_score(ref_hidden, cand_hidden, head, t_all, cand_head, device=dev)
    return score_hidden_tiled(
        ref_hidden, cand_hidden, head, t_all, cand_head, tile_rows=tile_rows, chunk_rows=chunk_rows, device=dev, threads=threads,
        compiled=compiled,
    )
