"""MKL's bf16 x bf16 -> fp32 GEMM reached through torch's library (harness/scoring/cblas_bf16.py).

Checked against float64 with the bound every correct fp32 accumulation meets in any summation
order (|error| <= gamma_K * sum |a_k b_k|, products of bf16 values being exact in fp32), on
strided views, a single row, an empty width, and with every argument check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.scoring import cblas_bf16

pytestmark = pytest.mark.skipif(not cblas_bf16.available(), reason="torch build without MKL's cblas_gemm_bf16bf16f32")
U = 2.0**-24


def _check(a: torch.Tensor, w: torch.Tensor, got: torch.Tensor) -> None:
    ad, wd = a.double().numpy(), w.double().numpy()
    k = a.shape[1]
    gamma = k * U / (1 - k * U)
    exact = ad @ wd.T
    bound = gamma * (np.abs(ad) @ np.abs(wd).T) + 1e-300
    err = np.abs(got.double().numpy() - exact)
    assert np.all(err <= bound), float((err / bound).max())


def test_exact_accumulation_on_strided_views() -> None:
    g = torch.Generator().manual_seed(0)
    k = 1536  # several K blocks
    a_full = (torch.randn(70, k + 8, generator=g) * 3).bfloat16()
    w_full = (torch.randn(515, k, generator=g) / k**0.5 * 4).bfloat16()
    a = a_full[3:68, 5 : 5 + k]  # rows strided by k + 8, offset start
    w = w_full[::2]  # every second head row: leading dimension 2k
    buf = torch.full((65, 300), 7.0)
    out = buf[:, 20 : 20 + w.shape[0]]
    cblas_bf16.gemm_bf16_f32(a, w, out)
    _check(a, w, out)
    assert bool((buf[:, :20] == 7).all() and (buf[:, 20 + w.shape[0] :] == 7).all())  # nothing written outside


def test_bound_has_power() -> None:
    """bf16-rounded results (a bf16-output GEMM) break the bound the MKL result meets."""
    g = torch.Generator().manual_seed(1)
    a = (torch.randn(16, 512, generator=g) * 3).bfloat16()
    w = (torch.randn(300, 512, generator=g) / 512**0.5 * 4).bfloat16()
    rounded = (a @ w.T).float()
    with pytest.raises(AssertionError):
        _check(a, w, rounded)


def test_single_row_and_empty_width() -> None:
    g = torch.Generator().manual_seed(2)
    w = torch.randn(40, 64, generator=g).bfloat16()
    a = torch.randn(1, 64, generator=g).bfloat16()
    out = cblas_bf16.gemm_bf16_f32(a, w, torch.empty(1, 40))
    _check(a, w, out)
    z = cblas_bf16.gemm_bf16_f32(a[:, :0], w[:, :0], torch.full((1, 40), 3.0))
    assert bool((z == 0).all())


def test_arguments_are_checked() -> None:
    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    w = torch.zeros(5, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="a: expected a 2-D torch.bfloat16"):
        cblas_bf16.gemm_bf16_f32(a.float(), w, torch.empty(4, 5))
    with pytest.raises(ValueError, match="out: expected a 2-D torch.float32"):
        cblas_bf16.gemm_bf16_f32(a, w, torch.empty(4, 5, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="unit column stride"):
        cblas_bf16.gemm_bf16_f32(torch.zeros(8, 4, dtype=torch.bfloat16).t(), w, torch.empty(4, 5))
    with pytest.raises(ValueError, match="shapes"):
        cblas_bf16.gemm_bf16_f32(a, w, torch.empty(4, 6))
