"""The scorer's GEMM paths (harness/scoring/gemm.py) against float64, on any CPU.

The bound used is one every correct fp32 accumulation meets, whatever its summation order or
blocking (so the test holds on AMD and Intel, with or without native bf16): for products that
are exact in fp32 (bf16 x bf16), |fl(sum a_k b_k) - sum a_k b_k| <= gamma_H * sum |a_k b_k| with
gamma_H = H u / (1 - H u), u = 2^-24. The shape is chosen so that rounding the logits to bf16
(what a bf16-output GEMM does) breaks that bound: the test can tell the two apart.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.scoring import cblas_bf16
from harness.scoring import gemm as gemm_mod
from harness.scoring.gemm import choose_gemm, gemm_mode, native_bf16_cpu
from harness.scoring.scorer import (
    bare_gemms,
    gemm_operand,
    logits_gemm,
    score_hidden,
    scorer_run,
)

H, V, N = 256, 3000, 40
U = 2.0**-24


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(N, H, generator=g) * 3).bfloat16()
    w = (torch.randn(V, H, generator=g) / H**0.5 * 4).bfloat16()
    return x, w


def _bound(x: torch.Tensor, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    xd, wd = x.double().numpy(), w.double().numpy()
    exact = xd @ wd.T  # float64: exact for these products and sums up to ~2^-53 relative
    gamma = H * U / (1 - H * U)
    return exact, gamma * (np.abs(xd) @ np.abs(wd).T) + 1e-300


def _logits(x: torch.Tensor, w: torch.Tensor, path: str) -> np.ndarray:
    with torch.inference_mode(), gemm_mode(path):
        wf = gemm_operand(w, torch.device("cpu"), path)
        assert wf.dtype == (torch.bfloat16 if path == "mkl-bf16-f32" else torch.float32)  # MKL: head never widened
        out = logits_gemm(x, wf, torch.empty(N, V, dtype=torch.float32))
    return out.double().numpy()


_NO_MKL = pytest.mark.skipif(not cblas_bf16.available(), reason="torch build without MKL's cblas_gemm_bf16bf16f32")


@pytest.mark.parametrize("path", ["onednn-bf16", "fp32", pytest.param("mkl-bf16-f32", marks=_NO_MKL)])
def test_gemm_path_is_an_exact_fp32_accumulation(path: str) -> None:
    x, w = _inputs()
    exact, bound = _bound(x, w)
    got = _logits(x, w, path)
    assert np.all(np.abs(got - exact) <= bound), float((np.abs(got - exact) / bound).max())


def test_bound_rejects_bf16_logits() -> None:
    """The bound has power: bf16-rounded logits (a bf16-output GEMM) violate it."""
    x, w = _inputs()
    exact, bound = _bound(x, w)
    bf16_logits = torch.from_numpy(exact).bfloat16().double().numpy()
    assert np.mean(np.abs(bf16_logits - exact) > bound) > 0.5


def test_mode_is_scoped_and_restored() -> None:
    prop = torch.backends.mkldnn.matmul
    before = prop.fp32_precision
    with gemm_mode("onednn-bf16"):
        assert prop.fp32_precision == "bf16"
    assert prop.fp32_precision == before
    with pytest.raises(RuntimeError), gemm_mode("onednn-bf16"):
        raise RuntimeError("boom")
    assert prop.fp32_precision == before
    x, w = _inputs()
    score_hidden(x, x, w, torch.zeros(N, dtype=torch.int64), backend="torch")
    assert prop.fp32_precision == before


def test_choice_native_fallback_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    bf = (torch.bfloat16,) * 3
    monkeypatch.delenv("FIDELITY_GEMM", raising=False)
    monkeypatch.setattr(gemm_mod, "native_bf16_cpu", lambda: True)
    monkeypatch.setattr(cblas_bf16, "available", lambda: True)
    assert choose_gemm(cpu, bf, False) == "mkl-bf16-f32"  # native bf16 and MKL's bf16 GEMM: first choice
    monkeypatch.setenv("FIDELITY_GEMM", "onednn-bf16")
    assert choose_gemm(cpu, bf, False) == "onednn-bf16"
    monkeypatch.delenv("FIDELITY_GEMM")
    monkeypatch.setattr(cblas_bf16, "available", lambda: False)  # a torch build without it
    assert choose_gemm(cpu, bf, False) == "onednn-bf16"
    monkeypatch.setenv("FIDELITY_GEMM", "mkl-bf16-f32")  # forced but missing: the automatic choice
    assert choose_gemm(cpu, bf, False) == "onednn-bf16"
    monkeypatch.delenv("FIDELITY_GEMM")
    assert choose_gemm(cpu, (torch.bfloat16, torch.float32, torch.bfloat16), False) == "fp32"  # fp32 operand: never rounded
    monkeypatch.setattr(gemm_mod, "native_bf16_cpu", lambda: False)  # a CPU without native bf16
    assert choose_gemm(cpu, bf, False) == "fp32"
    monkeypatch.setattr(cblas_bf16, "available", lambda: True)
    assert choose_gemm(cpu, bf, False) == "fp32"  # MKL would emulate bf16: not chosen automatically
    monkeypatch.setenv("FIDELITY_GEMM", "mkl-bf16-f32")
    assert choose_gemm(cpu, bf, False) == "mkl-bf16-f32"
    monkeypatch.setenv("FIDELITY_GEMM", "onednn-bf16")
    assert choose_gemm(cpu, bf, False) == "onednn-bf16"
    monkeypatch.setenv("FIDELITY_GEMM", "fp32")
    monkeypatch.setattr(gemm_mod, "native_bf16_cpu", lambda: True)
    assert choose_gemm(cpu, bf, False) == "fp32"
    monkeypatch.setenv("FIDELITY_GEMM", "bogus")
    with pytest.raises(ValueError, match="FIDELITY_GEMM"):
        choose_gemm(cpu, bf, False)


@pytest.mark.parametrize(
    "native, mkl", [(True, False), (False, False), pytest.param(True, True, marks=_NO_MKL)]
)
def test_scorer_reports_and_runs_the_path(monkeypatch: pytest.MonkeyPatch, native: bool, mkl: bool) -> None:
    """Every path (MKL's bf16 GEMM, oneDNN's bf16 mode, the fp32 fallback) scores identically to the
    float64 logits' tolerance, and scorer_run names the path score_hidden takes."""
    monkeypatch.delenv("FIDELITY_GEMM", raising=False)
    monkeypatch.setattr(gemm_mod, "native_bf16_cpu", lambda: native)
    if not mkl:
        monkeypatch.setattr(cblas_bf16, "available", lambda: False)
    x, w = _inputs(1)
    c = (x.float() + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(2))).bfloat16()
    y = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(3))
    run = scorer_run(x, c, w, backend="torch")
    assert run.backend == "torch" and run.gemm == ("mkl-bf16-f32" if mkl else "onednn-bf16" if native else "fp32")
    s = score_hidden(x, c, w, y, backend="torch")
    la, lb = x.double().numpy() @ w.double().numpy().T, c.double().numpy() @ w.double().numpy().T
    lp = la - la.max(1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(1, keepdims=True))
    lq = lb - lb.max(1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(1, keepdims=True))
    kld = (np.exp(lp) * (lp - lq)).sum(1)
    np.testing.assert_allclose(s.kld, kld, rtol=1e-3, atol=1e-6)


def test_native_detection_matches_torch() -> None:
    assert native_bf16_cpu() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@pytest.mark.parametrize("gemm", [None, "fp32"])
def test_bare_gemms_time_the_chosen_path(monkeypatch: pytest.MonkeyPatch, gemm: str | None) -> None:
    """bare_gemms times exactly the scorer's GEMMs: logits_tiles on the path gemm_path chooses (or the one
    forced), every row of both sides once, and those logits are an exact fp32 accumulation (the float64
    bound above); the time it returns lies within the wall time of the call."""
    import time

    from harness.scoring import torch_path

    x, w = _inputs()
    c = (x.float() * 0.5).bfloat16()
    exact_r, bound = _bound(x, w)
    exact_c, bound_c = _bound(c, w)
    real = torch_path.logits_tiles
    seen: list[tuple[str, int, int]] = []

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        path = args[6]
        for r0, lr, lc in real(*args, **kwargs):
            m = lr.shape[0]
            assert np.all(np.abs(lr.double().numpy() - exact_r[r0 : r0 + m]) <= bound[r0 : r0 + m])
            assert np.all(np.abs(lc.double().numpy() - exact_c[r0 : r0 + m]) <= bound_c[r0 : r0 + m])
            seen.append((path, r0, m))
            yield r0, lr, lc

    monkeypatch.setattr(torch_path, "logits_tiles", recording)
    t0 = time.perf_counter()
    took = bare_gemms(x, c, w, tile_rows=16, gemm=gemm)
    wall = time.perf_counter() - t0
    want = gemm or torch_path.gemm_path(torch.device("cpu"), x, c, w)
    assert {p for p, _, _ in seen} == {want}
    starts = [r0 for _, r0, _ in seen]
    assert len(seen) > 1 and starts == [sum(m for _, _, m in seen[:i]) for i in range(len(seen))]  # contiguous tiles
    assert sum(m for _, _, m in seen) == N  # every row once
    assert 0 < took <= wall
