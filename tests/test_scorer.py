"""Scorer against an independent float64 numpy/scipy reference, on random and adversarial inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon
from scipy.special import entr, rel_entr
from scipy.special import log_softmax as np_log_softmax

from harness.scoring.scorer import (
    MEMORY_BUDGET_BYTES,
    PositionScores,
    default_tile_rows,
    score_hidden,
    score_logits,
    score_two_pass,
)


def reference(ref_logits: torch.Tensor, cand_logits: torch.Tensor, targets: torch.Tensor) -> dict[str, np.ndarray]:
    """Independent float64 implementation (scipy), from the same logits the scorer sees."""
    la = np_log_softmax(ref_logits.double().numpy(), axis=1)
    lb = np_log_softmax(cand_logits.double().numpy(), axis=1)
    p, q = np.exp(la), np.exp(lb)
    y = targets.numpy()
    idx = np.arange(p.shape[0])
    return {
        "kld": rel_entr(p, q).sum(1),
        # scipy's distance is sqrt(JSD): for near-identical rows it takes sqrt of a ~-1e-17 rounding residue -> NaN
        "jsd_bits": np.nan_to_num(np.array([jensenshannon(p[i], q[i], base=2) ** 2 for i in idx]), nan=0.0),
        "ear": np.minimum(p, q).sum(1),
        "nll_ref": -la[idx, y],
        "nll_cand": -lb[idx, y],
        "argmax_ref": ref_logits.double().numpy().argmax(1),
        "argmax_cand": cand_logits.double().numpy().argmax(1),
        "kld_rev": rel_entr(q, p).sum(1),
        "entropy_ref": entr(p).sum(1),
        "p_ref_top": p.max(1),
        "q_ref_top": q[idx, p.argmax(1)],
        **{f"top{k}_overlap": _overlap(ref_logits, cand_logits, k) for k in (5, 10)},
    }


def _overlap(ref_logits: torch.Tensor, cand_logits: torch.Tensor, k: int) -> np.ndarray:
    """Tokens shared by the k largest float64 logits of each row (ties to the lowest id, by a stable sort)."""
    a = np.argsort(-ref_logits.double().numpy(), axis=1, kind="stable")[:, :k]
    b = np.argsort(-cand_logits.double().numpy(), axis=1, kind="stable")[:, :k]
    return np.array([len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b)])


def assert_matches(s: PositionScores, ref: dict[str, np.ndarray], rtol: float = 2e-5, atol: float = 2e-7) -> None:
    __tracebackhide__ = True
    for k in ("kld", "jsd_bits", "ear", "nll_ref", "nll_cand", "kld_rev", "entropy_ref", "p_ref_top", "q_ref_top"):
        np.testing.assert_allclose(getattr(s, k), ref[k], rtol=rtol, atol=atol, err_msg=k)
    for k in ("argmax_ref", "argmax_cand", "top5_overlap", "top10_overlap"):
        np.testing.assert_array_equal(getattr(s, k), ref[k], err_msg=k)


def _pair(n: int, v: int, scale: float, noise: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, v, generator=g) * scale
    b = a + noise * torch.randn(n, v, generator=g)
    y = torch.randint(0, v, (n,), generator=g)
    return a, b, y


@pytest.mark.parametrize(
    "n,v,scale,noise,tile",
    [
        (17, 1000, 3.0, 0.3, None),  # random
        (10, 997, 2.0, 0.05, 3),  # vocab prime, rows not divisible by the tile
        (1, 50, 1.0, 1.0, None),  # N = 1
        (8, 300, 40.0, 2.0, 5),  # very peaked
        (6, 512, 1e-3, 1e-3, 4),  # nearly flat
        (5, 4096, 5.0, 0.001, 2),  # tiny divergences
    ],
)
def test_logits_mode_matches_reference(n: int, v: int, scale: float, noise: float, tile: int | None) -> None:
    a, b, y = _pair(n, v, scale, noise)
    s = score_logits(a, b, y, tile_rows=tile)
    assert len(s) == n
    assert_matches(s, reference(a, b, y))


def test_log_probs_input_equals_logits_input() -> None:
    a, b, y = _pair(9, 700, 3.0, 0.5)
    s1 = score_logits(a, b, y)
    s2 = score_logits(torch.log_softmax(a.double(), 1).float(), torch.log_softmax(b.double(), 1).float(), y)
    np.testing.assert_allclose(s1.kld, s2.kld, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(s1.nll_ref, s2.nll_ref, rtol=1e-5, atol=1e-5)


def test_extreme_logits_pm_1e4() -> None:
    g = torch.Generator().manual_seed(1)
    a = (torch.rand(6, 257, generator=g) * 2e4 - 1e4).round()
    b = a.flip(1)
    b[0] = a[0]  # one identical row
    a[1, 3] = 1e4
    b[1, 3] = -1e4
    y = torch.randint(0, 257, (6,), generator=g)
    s = score_logits(a, b, y, tile_rows=4)
    ref = reference(a, b, y)
    assert np.isfinite(s.kld).all() and np.isfinite(s.jsd_bits).all()
    assert s.kld[0] == 0.0 and s.jsd_bits[0] == 0.0 and s.ear[0] == 1.0
    # q underflows to 0 in float64, so rel_entr says inf; the exact value is finite: sum p (ln p - ln q)
    la = np_log_softmax(a.double().numpy(), axis=1)
    lb = np_log_softmax(b.double().numpy(), axis=1)
    exact = (np.exp(la) * (la - lb)).sum(1)
    assert np.isinf(ref["kld"][1:]).all()
    np.testing.assert_allclose(s.kld, exact, rtol=1e-6)
    np.testing.assert_allclose(s.jsd_bits, ref["jsd_bits"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(s.ear, ref["ear"], atol=1e-6)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0, 1e4])
def test_identical_operands_give_exact_zero(scale: float) -> None:
    a, _, y = _pair(7, 333, scale, 0.0)
    s = score_logits(a, a.clone(), y, tile_rows=3)
    assert (s.kld == 0.0).all()
    assert (s.jsd_bits == 0.0).all()
    assert (s.ear == 1.0).all()
    np.testing.assert_array_equal(s.nll_ref, s.nll_cand)
    assert s.top1.all()
    assert (s.kld_rev == 0.0).all()
    np.testing.assert_array_equal(s.q_ref_top, s.p_ref_top)
    assert (s.top5_overlap == 5).all() and (s.top10_overlap == 10).all()


def test_hidden_mode_matches_reference_fp32() -> None:
    g = torch.Generator().manual_seed(2)
    n, h, v = 21, 64, 1001
    rh = torch.randn(n, h, generator=g)
    ch = rh + 0.1 * torch.randn(n, h, generator=g)
    head = torch.randn(v, h, generator=g) * 0.3
    y = torch.randint(0, v, (n,), generator=g)
    s = score_hidden(rh, ch, head, y, tile_rows=8, chunk_rows=3)
    assert_matches(s, reference(rh @ head.T, ch @ head.T, y))


def test_hidden_mode_bf16_gives_fp32_logits_of_exact_products() -> None:
    """bf16 operands, fp32 logits: matches float64 products of the bf16 values, no bf16 noise floor."""
    g = torch.Generator().manual_seed(3)
    n, h, v = 12, 128, 515
    rh = (3 * torch.randn(n, h, generator=g)).bfloat16()
    ch = (rh.float() + 0.01 * torch.randn(n, h, generator=g)).bfloat16()
    head = (torch.randn(v, h, generator=g) * 0.2).bfloat16()
    y = torch.randint(0, v, (n,), generator=g)
    s = score_hidden(rh, ch, head, y, tile_rows=5)
    # independent: float64 products of the exact bf16 values, float64 softmax math
    want = reference(rh.double() @ head.double().T, ch.double() @ head.double().T, y)
    np.testing.assert_allclose(s.kld, want["kld"], rtol=5e-3, atol=2e-8)  # fp32 accumulation
    # logits rounded to bf16 (what a CPU bf16 GEMM returns) are off by far more: the floor we avoid
    rounded = reference((rh @ head.T).double(), (ch @ head.T).double(), y)
    assert np.abs(rounded["kld"] - want["kld"]).max() > 10 * np.abs(s.kld - want["kld"]).max()
    same = score_hidden(rh, rh, head, y)
    assert (same.kld == 0.0).all()


def test_separate_candidate_head() -> None:
    g = torch.Generator().manual_seed(4)
    n, h, v = 9, 32, 400
    hid = torch.randn(n, h, generator=g)
    head = torch.randn(v, h, generator=g)
    cand_head = head + 0.05 * torch.randn(v, h, generator=g)
    y = torch.randint(0, v, (n,), generator=g)
    s = score_hidden(hid, hid, head, y, cand_head=cand_head, tile_rows=4)
    assert_matches(s, reference(hid @ head.T, hid @ cand_head.T, y))
    assert (s.kld > 0).all()


def test_argmax_ties_go_to_lowest_id() -> None:
    a = torch.zeros(3, 10)
    a[0, [2, 7]] = 5.0
    a[1] = 1.0  # all tied
    a[2, [9, 4]] = 3.0
    b = a.flip(1)
    s = score_logits(a, b, torch.zeros(3, dtype=torch.int64))
    assert s.argmax_ref.tolist() == [2, 0, 4]
    assert s.argmax_cand.tolist() == [2, 0, 0]
    assert s.top1.tolist() == [True, True, False]


def test_tiling_does_not_change_results(same_scores: Any) -> None:
    g = torch.Generator().manual_seed(5)
    n, h, v = 19, 48, 777
    rh, ch = torch.randn(n, h, generator=g), torch.randn(n, h, generator=g)
    head = torch.randn(v, h, generator=g) * 0.2
    y = torch.randint(0, v, (n,), generator=g)
    base = score_hidden(rh, ch, head, y)
    for tile, chunk in [(1, 1), (7, 2), (19, 19), (64, 5)]:
        s = score_hidden(rh, ch, head, y, tile_rows=tile, chunk_rows=chunk)
        # Another tiling sums each logit in another order: equal within the fp32 accumulation bound.
        same_scores(s, base, rh, ch, head, label=f"tile={tile} chunk={chunk}")


def test_threads_argument_restores_setting() -> None:
    before = torch.get_num_threads()
    a, b, y = _pair(3, 100, 1.0, 0.1)
    rh = torch.randn(3, 8)
    score_hidden(rh, rh, torch.randn(100, 8), y, threads=1)
    assert torch.get_num_threads() == before


def test_two_pass_matches_single_pass() -> None:
    g = torch.Generator().manual_seed(6)
    n, h, v = 10, 32, 1000
    rh, ch = torch.randn(n, h, generator=g), torch.randn(n, h, generator=g)
    head = torch.randn(v, h, generator=g) * 0.3
    y = torch.randint(0, v, (n,), generator=g)
    np.testing.assert_allclose(
        score_two_pass(rh, ch, head, vocab_chunk=300), score_hidden(rh, ch, head, y).kld, rtol=1e-5
    )


def test_bad_inputs_are_named() -> None:
    a, b, y = _pair(4, 50, 1.0, 0.1)
    with pytest.raises(ValueError, match="targets"):
        score_logits(a, b, torch.tensor([0, 1, 2, 50]))
    with pytest.raises(ValueError, match="logits"):
        score_logits(a, b[:3], y)
    with pytest.raises(ValueError, match="head"):
        score_hidden(torch.randn(4, 8), torch.randn(4, 8), torch.randn(50, 9), y)


def test_position_scores_concat_select_len() -> None:
    a, b, y = _pair(6, 80, 2.0, 0.5)
    s = score_logits(a, b, y)
    parts = [s.select(np.arange(0, 2)), s.select(np.arange(2, 6))]
    c = PositionScores.concat(parts)
    assert len(c) == 6
    for k, v in s.to_dict().items():
        np.testing.assert_array_equal(getattr(c, k), v)
    assert len(s.select(s.top1)) == int(s.top1.sum())
    assert len(PositionScores.concat([])) == 0


def test_default_tile_rows_respects_budget() -> None:
    assert default_tile_rows(152_064, 2) * 2 * 152_064 * 2 <= MEMORY_BUDGET_BYTES
    assert default_tile_rows(100, 2) == 1024
    assert default_tile_rows(10**9, 2) == 16


logit_rows = st.integers(min_value=2, max_value=60).flatmap(
    lambda v: st.tuples(
        st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=v, max_size=v),
        st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=v, max_size=v),
    )
)


@settings(max_examples=60, deadline=None)
@given(logit_rows)
def test_property_divergences_in_range(rows: tuple[list[float], list[float]]) -> None:
    a = torch.tensor([rows[0]], dtype=torch.float32)
    b = torch.tensor([rows[1]], dtype=torch.float32)
    y = torch.tensor([0])
    s = score_logits(a, b, y)
    assert s.kld[0] >= -1e-9
    assert s.jsd_bits[0] >= -1e-9 and s.jsd_bits[0] <= 1.0 + 1e-6
    assert 0.0 <= s.ear[0] <= 1.0
    same = score_logits(a, a.clone(), y)
    assert same.kld[0] == 0.0 and same.jsd_bits[0] == 0.0 and same.ear[0] == 1.0
    ref = reference(a, b, y)
    np.testing.assert_allclose(s.kld, ref["kld"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(s.jsd_bits, ref["jsd_bits"], rtol=1e-4, atol=1e-6)
