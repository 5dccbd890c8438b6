"""bf16 x bf16 -> fp32 GEMM on a CPU: MKL's ``cblas_gemm_bf16bf16f32``, as shipped inside torch.

torch's x86 CPU builds link Intel MKL into ``libtorch_cpu.so`` and export its CBLAS entry point
``cblas_gemm_bf16bf16f32``: bf16 operands, products accumulated in fp32, an **fp32 result**
(never rounded to bf16). On a CPU with AMX or avx512_bf16 it runs on the bf16 units, so the
scorer gets exact fp32 logits (docs/design.md, section 2) at about the speed of a bf16 GEMM,
without widening the head to fp32 (a 248,320 x 5,120 head stays 2.5 GB instead of 5 GB) and
without a compiled extension of this project's own: the function is called through
:mod:`ctypes` on the library torch already loaded.

Reasoning: docs/performance.md §"MKL's bf16 GEMM".
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from functools import lru_cache

import torch

__all__ = ["available", "gemm_bf16_f32"]

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_INT_MAX = 2**31 - 1


@lru_cache(maxsize=1)
def _function() -> Callable[..., None] | None:
    """The ctypes function, or None when torch's library does not export it."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        lib = ctypes.CDLL(path)
        fn = lib.cblas_gemm_bf16bf16f32
    except (OSError, AttributeError):
        return None
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    fn.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    fn.restype = None
    return fn


def _ld(t: torch.Tensor) -> int:
    """Leading dimension of a row-major matrix (a single row's stride is arbitrary; CBLAS wants >= width)."""
    return max(t.stride(0), t.shape[1], 1) if t.shape[0] > 1 else max(t.shape[1], 1)


def _call(fn: Callable[..., None], a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
    m, k = a.shape
    n = w.shape[0]
    fn(_ROW_MAJOR, _NO_TRANS, _TRANS, m, n, k, 1.0, a.data_ptr(), _ld(a), w.data_ptr(), _ld(w), 0.0,
       out.data_ptr(), _ld(out))


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether ``cblas_gemm_bf16bf16f32`` resolves in torch's library and passes the self-test."""
    fn = _function()
    if fn is None:
        return False
    g = torch.Generator().manual_seed(0)
    # Values are small integers times powers of two: every product and partial sum is exact in
    # fp32, so the fp32 result must equal the float64 one bit for bit, in any summation order.
    a_full = (torch.randint(-8, 9, (37, 70), generator=g) * 0.25).bfloat16()
    w_full = (torch.randint(-8, 9, (53, 70), generator=g) * 0.5).bfloat16()
    a, w = a_full[:, :67], w_full[:, :67]  # leading dimension 70 > width 67
    out_full = torch.full((37, 60), -1.0)
    out = out_full[:, 3:56]  # leading dimension 60 > 53 columns, offset start
    try:
        _call(fn, a, w, out)
    except (OSError, ValueError):  # pragma: no cover - a broken library
        return False
    exact = (a.double() @ w.double().T).float()
    untouched = bool((out_full[:, :3] == -1).all() and (out_full[:, 56:] == -1).all())
    return bool(torch.equal(out, exact)) and untouched


def _check(name: str, t: torch.Tensor, dtype: torch.dtype) -> None:
    if t.device.type != "cpu" or t.dtype != dtype or t.ndim != 2:
        raise ValueError(f"cblas_gemm_bf16bf16f32: {name}: expected a 2-D {dtype} CPU tensor, found {t.dtype} "
                         f"{t.ndim}-D on {t.device}")
    if t.shape[0] > 0 and t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"cblas_gemm_bf16bf16f32: {name}: expected unit column stride, found strides {t.stride()}")
    if t.shape[0] > 1 and t.stride(0) < t.shape[1]:
        raise ValueError(f"cblas_gemm_bf16bf16f32: {name}: rows overlap (strides {t.stride()}, shape {list(t.shape)})")
    if max(*t.shape, t.stride(0)) > _INT_MAX:
        raise ValueError(f"cblas_gemm_bf16bf16f32: {name}: dimensions {list(t.shape)} exceed 32-bit integers")


def gemm_bf16_f32(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = a @ w.T`` in fp32: ``a`` [M, K] and ``w`` [N, K] bf16, ``out`` [M, N] fp32.

    Rows may be strided (leading dimensions), columns must be contiguous; ``out`` may be a view
    into a wider buffer. Raises ``RuntimeError`` when :func:`available` is false.
    """
    fn = _function()
    if fn is None or not available():
        raise RuntimeError("cblas_gemm_bf16bf16f32 is not available in this torch build")
    _check("a", a, torch.bfloat16)
    _check("w", w, torch.bfloat16)
    _check("out", out, torch.float32)
    m, k = a.shape
    if w.shape[1] != k or out.shape[0] != m or out.shape[1] != w.shape[0]:
        raise ValueError(f"cblas_gemm_bf16bf16f32: shapes {list(a.shape)} x {list(w.shape)}^T -> {list(out.shape)}")
    if m == 0 or w.shape[0] == 0:
        return out
    if k == 0:
        return out.zero_()
    _call(fn, a, w, out)
    return out
