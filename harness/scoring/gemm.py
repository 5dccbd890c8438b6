"""Which GEMM produces the scorer's fp32 logits, and a scoped switch for it.

Reasoning: docs/performance.md §"Choosing the GEMM".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from types import ModuleType

import torch

from harness.scoring import cblas_bf16


def _mkldnn() -> ModuleType:
    """``torch.backends.mkldnn`` (a property module whose attributes mypy cannot see)."""
    return torch.backends.mkldnn

__all__ = ["BF16_OPERAND_PATHS", "GEMM_PATHS", "choose_gemm", "gemm_mode", "native_bf16_cpu", "onednn_bf16_available"]

#: Every value :func:`choose_gemm` can return.
GEMM_PATHS = ("cuda-out-dtype", "mkl-bf16-f32", "onednn-bf16", "fp32")
#: Paths that take the bf16 operands as they are (the head is never widened for them).
BF16_OPERAND_PATHS = ("cuda-out-dtype", "mkl-bf16-f32")
_CHOICES = ("auto", "fp32", "onednn-bf16", "mkl-bf16-f32")


@lru_cache(maxsize=1)
def native_bf16_cpu() -> bool:
    """Whether this CPU has native bf16 for oneDNN (torch's own check: avx512bw/vl/dq or Arm bf16)."""
    try:
        return bool(_mkldnn().is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def onednn_bf16_available() -> bool:
    """Whether torch exposes oneDNN's fp32-matmul precision switch at all."""
    try:
        return bool(_mkldnn().is_available()) and hasattr(_mkldnn(), "matmul")
    except AttributeError:
        return False


def choose_gemm(device: torch.device, operand_dtypes: tuple[torch.dtype, ...], cuda_out_dtype: bool) -> str:
    """The GEMM path (one of :data:`GEMM_PATHS`) for operands of ``operand_dtypes`` on ``device``.

    ``cuda_out_dtype``: whether ``mm(..., out_dtype=float32)`` works on ``device`` (probed by the caller).
    """
    all_bf16 = all(d == torch.bfloat16 for d in operand_dtypes)
    half = all(d in (torch.bfloat16, torch.float16) for d in operand_dtypes)
    if device.type != "cpu":
        return "cuda-out-dtype" if half and cuda_out_dtype else "fp32"
    choice = os.environ.get("FIDELITY_GEMM", "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"FIDELITY_GEMM: expected one of {', '.join(_CHOICES)}, found {choice!r}")
    if choice == "fp32" or not all_bf16:
        return "fp32"
    if choice in ("auto", "mkl-bf16-f32") and cblas_bf16.available():
        if choice == "mkl-bf16-f32" or native_bf16_cpu():
            return "mkl-bf16-f32"
    if choice == "mkl-bf16-f32":
        choice = "auto"
    if not onednn_bf16_available():
        return "fp32"
    if choice == "onednn-bf16" or native_bf16_cpu():
        return "onednn-bf16"
    return "fp32"


@contextmanager
def gemm_mode(path: str) -> Iterator[None]:
    """Set oneDNN's fp32-matmul precision for ``path`` inside the block; restore the previous value after."""
    if path != "onednn-bf16":
        yield
        return
    prop = _mkldnn().matmul
    old = prop.fp32_precision
    prop.fp32_precision = "bf16"
    try:
        yield
    finally:
        prop.fp32_precision = old
