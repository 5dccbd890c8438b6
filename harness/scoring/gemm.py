"""Which GEMM produces the scorer's fp32 logits, and a scoped switch for it.

The scorer needs fp32 logits of bf16 operands: products of the operands' exact values, summed in
fp32 (docs/performance.md). Four ways to get them, chosen per call by :func:`choose_gemm`:

* ``"cuda-out-dtype"`` -- ``torch.mm(bf16, bf16, out_dtype=float32)`` (CUDA in recent torch).
* ``"mkl-bf16-f32"`` -- a CPU with native bf16 whose torch build carries MKL: MKL's
  ``cblas_gemm_bf16bf16f32`` (:mod:`harness.scoring.cblas_bf16`) multiplies the bf16 operands
  as they are and returns fp32 -- the speed of a bf16 GEMM, no widened copy of the head. Chosen
  first when all operands are bf16 and the self-test passes.
* ``"onednn-bf16"`` -- a CPU whose oneDNN has native bf16 (avx512_bf16 / AMX on x86, bf16 on
  Arm): the operands are widened to fp32 (exact) and multiplied with oneDNN's
  bf16-convert/fp32-accumulate mode for fp32 matmuls
  (``torch.backends.mkldnn.matmul.fp32_precision = "bf16"``). Converting a bf16-*valued* fp32
  number to bf16 is lossless and a bf16 x bf16 product is exact in fp32, so the result is an
  fp32 accumulation of the exact products -- the same numbers as an fp32 GEMM up to summation
  order -- at the speed of a bf16 GEMM. Used only when both hidden states and the head are bf16
  tensors (an fp32 operand would be rounded). The mode is set by :func:`gemm_mode` around the
  scorer's GEMMs only and the previous setting restored: never a global side effect.
* ``"fp32"`` -- everywhere else (no native bf16, fp32 operands, ``FIDELITY_GEMM=fp32``): fp32
  GEMMs on the widened operands (exact, slower).

``FIDELITY_GEMM`` (``auto`` | ``fp32`` | ``onednn-bf16`` | ``mkl-bf16-f32``) overrides the
choice on a CPU; ``onednn-bf16`` forces the mode even without native bf16 (oneDNN then runs its
fp32 kernels or emulates -- still exact for bf16-valued operands, which ``tests/test_gemm.py``
checks), and ``mkl-bf16-f32`` forces MKL's bf16 GEMM where it exists (without native bf16 MKL
emulates it; exact, speed unmeasured) and falls back to the ``auto`` choice where it does not.
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
