"""The compiled metric kernel (harness/scoring/metric_kernel.py) against an independent float64 scipy
reference, against the eager metric pass, and the rule that decides when it runs."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from scipy.special import entr, rel_entr
from scipy.special import log_softmax as np_log_softmax

from harness.scoring import metric_kernel
from harness.scoring.scorer import score_hidden, score_logits

FLOAT_FIELDS = ("kld", "jsd_bits", "ear", "nll_ref", "nll_cand", "kld_rev", "entropy_ref", "p_ref_top", "q_ref_top")
INT_FIELDS = ("argmax_ref", "argmax_cand", "top5_overlap", "top10_overlap")


def _reference(a: torch.Tensor, b: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
    """Every score from float64 log-softmaxes (scipy), computed apart from the code under test."""
    la = np_log_softmax(a.double().numpy(), axis=1)
    lb = np_log_softmax(b.double().numpy(), axis=1)
    p, q = np.exp(la), np.exp(lb)
    m = 0.5 * (p + q)
    idx = np.arange(p.shape[0])
    top = {}
    for k in (5, 10):
        ta = np.argsort(-a.double().numpy(), axis=1, kind="stable")[:, :k]
        tb = np.argsort(-b.double().numpy(), axis=1, kind="stable")[:, :k]
        top[f"top{k}_overlap"] = np.array([len(set(x.tolist()) & set(z.tolist())) for x, z in zip(ta, tb, strict=True)])
    return {
        "kld": rel_entr(p, q).sum(1),
        "jsd_bits": 0.5 * (rel_entr(p, m).sum(1) + rel_entr(q, m).sum(1)) / np.log(2.0),
        "ear": np.minimum(p, q).sum(1),
        "nll_ref": -la[idx, y.numpy()],
        "nll_cand": -lb[idx, y.numpy()],
        "argmax_ref": a.double().numpy().argmax(1),
        "argmax_cand": b.double().numpy().argmax(1),
        "kld_rev": rel_entr(q, p).sum(1),
        "entropy_ref": entr(p).sum(1),
        "p_ref_top": p.max(1),
        "q_ref_top": q[idx, p.argmax(1)],
        **top,
    }


@pytest.fixture
def inductor(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The compiled kernel forced at every size (skipped where no C++ compiler is on PATH)."""
    if not metric_kernel.compiler_path():
        pytest.skip("no C++ compiler on PATH: torch.compile cannot build the CPU kernel")
    monkeypatch.setenv("FIDELITY_METRIC_KERNEL", "inductor")
    yield


def _pair(n: int, v: int, scale: float, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, v, generator=g) * scale
    return a, a + noise * torch.randn(n, v, generator=g), torch.randint(0, v, (n,), generator=g)


@pytest.mark.slow
@pytest.mark.parametrize(
    "n,v,scale,noise",
    [(17, 1000, 3.0, 0.3), (10, 997, 2.0, 0.05), (8, 300, 40.0, 2.0), (6, 512, 1e-3, 1e-3), (5, 4096, 5.0, 1e-3)],
)
def test_compiled_kernel_matches_float64(inductor: None, n: int, v: int, scale: float, noise: float) -> None:
    a, b, y = _pair(n, v, scale, noise, seed=n)
    s = score_logits(a, b, y, tile_rows=4)
    want = _reference(a, b, y)
    for k in FLOAT_FIELDS:
        np.testing.assert_allclose(getattr(s, k), want[k], rtol=2e-5, atol=2e-7, err_msg=k)
    for k in INT_FIELDS:
        np.testing.assert_array_equal(getattr(s, k), want[k], err_msg=k)


@pytest.mark.slow
def test_compiled_kernel_exact_zero_ties_and_extremes(inductor: None) -> None:
    g = torch.Generator().manual_seed(3)
    a = (torch.rand(6, 257, generator=g) * 2e4 - 1e4).round()
    b = a.flip(1)
    b[0] = a[0]  # identical row: exactly 0 / 0 / 1
    a[2] = 0.0
    a[2, [200, 7, 99]] = 5.0  # a three-way tie: the lowest id wins
    y = torch.randint(0, 257, (6,), generator=g)
    s = score_logits(a, b, y)
    assert s.kld[0] == 0.0 and s.jsd_bits[0] == 0.0 and s.ear[0] == 1.0 and s.kld_rev[0] == 0.0
    assert s.argmax_ref[2] == 7
    la = np_log_softmax(a.double().numpy(), axis=1)
    lb = np_log_softmax(b.double().numpy(), axis=1)
    np.testing.assert_allclose(s.kld, (np.exp(la) * (la - lb)).sum(1), rtol=1e-6)  # q underflows: rel_entr says inf


@pytest.mark.slow
def test_compiled_and_eager_agree_in_hidden_mode(inductor: None, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(4)
    n, h, v = 33, 64, 3001
    rh = torch.randn(n, h, generator=g).bfloat16()
    ch = (rh.float() + 0.05 * torch.randn(n, h, generator=g)).bfloat16()
    head = (torch.randn(v, h, generator=g) * 0.3).bfloat16()
    y = torch.randint(0, v, (n,), generator=g)
    compiled = score_hidden(rh, ch, head, y, tile_rows=16)
    monkeypatch.setenv("FIDELITY_METRIC_KERNEL", "eager")
    eager = score_hidden(rh, ch, head, y, tile_rows=16)
    for k in FLOAT_FIELDS:
        np.testing.assert_allclose(getattr(compiled, k), getattr(eager, k), rtol=2e-5, atol=2e-7, err_msg=k)
    for k in INT_FIELDS:
        np.testing.assert_array_equal(getattr(compiled, k), getattr(eager, k), err_msg=k)
    assert abs(compiled.kld.mean() - eager.kld.mean()) <= 1e-6 * eager.kld.mean()


def test_choice_follows_size_device_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compile() -> bool:
        raise AssertionError("compiled below the size threshold")

    cpu = torch.device("cpu")
    monkeypatch.setattr(metric_kernel, "available", no_compile)
    monkeypatch.delenv("FIDELITY_METRIC_KERNEL", raising=False)
    assert not metric_kernel.use_compiled(256, 4096, cpu)  # a test-sized model: never worth a compile
    assert not metric_kernel.use_compiled(1 << 20, 1 << 20, torch.device("cuda"))
    monkeypatch.setenv("FIDELITY_METRIC_KERNEL", "eager")
    assert not metric_kernel.use_compiled(1 << 20, 1 << 20, cpu)
    monkeypatch.setenv("FIDELITY_METRIC_KERNEL", "fast")
    with pytest.raises(ValueError, match="FIDELITY_METRIC_KERNEL: expected one of auto, inductor, eager, found 'fast'"):
        metric_kernel.use_compiled(8, 8, cpu)
    monkeypatch.setenv("FIDELITY_METRIC_KERNEL", "auto")
    monkeypatch.setattr(metric_kernel, "available", lambda: True)
    assert metric_kernel.use_compiled(2047, 248_320, cpu)  # one context of the seed suite
    monkeypatch.setattr(metric_kernel, "available", lambda: False)
    assert not metric_kernel.use_compiled(2047, 248_320, cpu)  # no working compiler: eager
    monkeypatch.setenv("FIDELITY_METRIC_KERNEL", "inductor")
    with pytest.raises(RuntimeError, match="FIDELITY_METRIC_KERNEL=inductor"):
        metric_kernel.use_compiled(8, 8, cpu)


def test_scorer_dispatches_to_the_compiled_kernel_at_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the threshold the scorer's chunks go through the compiled kernel (here a stand-in that
    runs the same function eagerly and counts its calls), below it they do not."""
    calls: list[int] = []

    def counted(ref: torch.Tensor, cand: torch.Tensor) -> tuple[torch.Tensor, ...]:
        calls.append(ref.shape[0])
        return metric_kernel.row_stats(ref, cand)

    monkeypatch.delenv("FIDELITY_METRIC_KERNEL", raising=False)
    monkeypatch.setattr(metric_kernel, "available", lambda: True)
    monkeypatch.setattr(metric_kernel, "compiled_row_stats", counted)
    a, b, y = _pair(12, 700, 3.0, 0.3, seed=9)
    eager = score_logits(a, b, y)
    assert calls == []
    monkeypatch.setattr(metric_kernel, "COMPILE_MIN_ELEMENTS", 12 * 700)
    s = score_logits(a, b, y)
    assert sum(calls) == 12
    want = _reference(a, b, y)
    for k in FLOAT_FIELDS:
        np.testing.assert_allclose(getattr(s, k), want[k], rtol=2e-5, atol=2e-7, err_msg=k)
        np.testing.assert_allclose(getattr(s, k), getattr(eager, k), rtol=2e-5, atol=2e-7, err_msg=k)


@pytest.mark.parametrize("ties", [1, 2, 9, 10, 11, 40])
def test_argmax_from_top_k_is_the_lowest_id_of_the_maximum(ties: int) -> None:
    """The compiled path's argmax (from the top-10 set) equals numpy's first-occurrence argmax, also
    when ten or more entries share the maximum (the top-10 set then need not hold the lowest one)."""
    g = torch.Generator().manual_seed(ties)
    x = torch.randn(5, 700, generator=g)
    for r in range(5):
        cols = torch.randperm(700, generator=g)[:ties]
        x[r, cols] = 9.0 + r  # the maximum, shared by `ties` entries
    top = torch.topk(x, 10, dim=1).indices  # a set of the 10 largest (which of tied entries: unspecified)
    am = metric_kernel.argmax_from_top(x, top, x.amax(1))
    assert am.tolist() == x.numpy().argmax(1).tolist()
