"""Fused full-vocabulary KL scorer in Triton: logits never leave the chip.

One program owns ``BLOCK_M`` rows (positions) and walks the vocabulary in ``BLOCK_N`` columns, computing
both sides' logits with ``tl.dot`` (bf16 operands, fp32 accumulation: the same fp32 logits as
:func:`harness.scoring.scorer.logits_gemm`) and folding them into per-row running statistics. Phase 1
(one pass over the head): normalizers, KL in a cancellation-free online form, reverse KL, entropy, top-1
(ties to the lowest id), top-k sets, NLLs; rows whose result is not finite are rescored by the torch
path. Phase 2 (``jsd_ear=True``, a second pass with the final normalizers): JSD and EAR. Per position
the two paths agree to |delta| <= 1e-6 + 1e-4 |value| (NLLs 1e-4), ``tests/test_fused_kl.py``.
Derivation, numerics and the interpreter's bf16 ``tl.dot`` workaround: docs/performance.md, "The fused
Triton kernel" and its "Derivation".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from harness.io.jsonio import JSONObject
from harness.metrics.scores import PositionScores
from harness.scoring.backends import interpreting
from harness.scoring.torch_path import TOPK as TOPK_REPORTED
from harness.scoring.torch_path import score_hidden_tiled

__all__ = ["fused_score", "phase1", "phase2", "DEFAULT_BLOCKS"]

#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) on CUDA; benchmarks/gpu_check.py sweeps others.
DEFAULT_BLOCKS: dict[str, tuple[int, int, int, int, int]] = {
    "cuda": (128, 128, 64, 8, 3),
    "interpret": (16, 64, 32, 1, 1),
}
_LN2 = math.log(2.0)
#: Length of the running top-k lists phase 1 keeps per row and side (the largest reported k).
TOPK = max(TOPK_REPORTED)


@triton.jit
def _expm1(x):
    # Kahan's accurate expm1 from exp and log: (u - 1) * x / ln u, u = e^x.
    u = tl.exp(x)
    um1 = u - 1.0
    one = u == 1.0
    r = um1 * x / tl.log(tl.where(one, 2.0, u))
    r = tl.where(one, x, r)
    r = tl.where(um1 == -1.0, -1.0, r)
    return r


@triton.jit
def _log1p(s):
    # Kahan: log(u) * s / (u - 1), u = 1 + s; exact for small s.
    u = 1.0 + s
    one = u == 1.0
    r = tl.log(u) * s / tl.where(one, 1.0, u - 1.0)
    return tl.where(one, s, r)


@triton.jit
def _phi(x):
    # phi(x) = e^(-x) - 1 + x >= 0: series for |x| < 1/8, Kahan expm1 otherwise.
    ser = x * x * (0.5 - x * (1.0 / 6.0 - x * (1.0 / 24.0 - x * (1.0 / 120.0 - x * (1.0 / 720.0 - x * (1.0 / 5040.0))))))
    return tl.where(tl.abs(x) < 0.125, ser, _expm1(-x) + x)


@triton.jit
def _tile_logits(HA, HB, W, WB, rows, cols, rmask, cmask, K, s_ha, s_hb, s_w, s_wb,
                 SHARED_W: tl.constexpr, UPCAST: tl.constexpr, EVEN_K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 logits of both operands for one [BLOCK_M, BLOCK_N] block."""
    ks = tl.arange(0, BLOCK_K)
    acc_l = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_m = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        if EVEN_K:
            am = rmask[:, None]
            wm = cmask[None, :]
        else:
            am = rmask[:, None] & (kk[None, :] < K)
            wm = cmask[None, :] & (kk[:, None] < K)
        ha = tl.load(HA + rows[:, None] * s_ha + kk[None, :], mask=am, other=0.0)
        hb = tl.load(HB + rows[:, None] * s_hb + kk[None, :], mask=am, other=0.0)
        w = tl.load(W + cols[None, :] * s_w + kk[:, None], mask=wm, other=0.0)  # [BLOCK_K, BLOCK_N]
        if SHARED_W:
            wb = w
        else:
            wb = tl.load(WB + cols[None, :] * s_wb + kk[:, None], mask=wm, other=0.0)
        if UPCAST:
            acc_l += tl.dot(ha.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            acc_m += tl.dot(hb.to(tl.float32), wb.to(tl.float32), input_precision="ieee")
        else:
            acc_l = tl.dot(ha, w, acc_l)
            acc_m = tl.dot(hb, wb, acc_m)
    return acc_l, acc_m


@triton.jit
def _topk_merge(vals, ids, blk, cols, TOPK: tl.constexpr):
    """Fold one column block into a running top-``TOPK`` list (``[BLOCK_M, KP]`` values and ids, unordered;
    slots ``>= TOPK`` hold +inf and are never evicted). The block's elements are taken in descending
    order (``tie_break_left``: lowest column first) and each replaces the list's minimum (among equal
    minima, the one with the highest id) while it is *strictly* larger: earlier blocks hold lower
    ids, so ties keep the lowest token ids. Only as many rounds run as the row that needs the most
    (the block elements above its current minimum, at most ``TOPK``), so late blocks cost little."""
    colpos = tl.arange(0, blk.shape[1])[None, :]
    mn0 = tl.min(vals, 1)
    need = tl.max(tl.sum((blk > mn0[:, None]).to(tl.int32), 1))
    for _ in range(0, tl.minimum(need, TOPK)):
        bm = tl.max(blk, 1)
        bp = tl.argmax(blk, 1, tie_break_left=True)
        mn = tl.min(vals, 1)
        take = bm > mn
        ev = tl.max(tl.where(vals == mn[:, None], ids, -2147483647), 1)
        hit = take[:, None] & (vals == mn[:, None]) & (ids == ev[:, None])
        b_id = tl.sum(tl.where(colpos == bp[:, None], cols[None, :], 0), 1)
        vals = tl.where(hit, bm[:, None], vals)
        ids = tl.where(hit, b_id[:, None], ids)
        blk = tl.where(take[:, None] & (colpos == bp[:, None]), float("-inf"), blk)
    return vals, ids


@triton.jit
def _phase1_kernel(HA, HB, W, WB, Y, OUT_F, OUT_I, OUT_T, N, V, K, s_ha, s_hb, s_w, s_wb,
                   SHARED_W: tl.constexpr, UPCAST: tl.constexpr, EVEN_K: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   TOPK: tl.constexpr, KP: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < N
    y = tl.load(Y + rows, mask=rmask, other=0)
    a = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    b = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    S = tl.zeros((BLOCK_M,), tl.float32)
    R = tl.zeros((BLOCK_M,), tl.float32)
    F = tl.zeros((BLOCK_M,), tl.float32)
    ly = tl.zeros((BLOCK_M,), tl.float32)
    my = tl.zeros((BLOCK_M,), tl.float32)
    c = tl.zeros((BLOCK_M,), tl.float32)
    ia = tl.zeros((BLOCK_M,), tl.int32)
    ib = tl.zeros((BLOCK_M,), tl.int32)
    E = tl.zeros((BLOCK_M,), tl.float32)  # sum e^(l-a) (a-l) >= 0 (entropy numerator)
    G = tl.zeros((BLOCK_M,), tl.float32)  # reverse-KL analogue of F, weighted by e^(m-b)
    mt = tl.zeros((BLOCK_M,), tl.float32)  # candidate logit at the running reference argmax
    slots = tl.arange(0, KP)[None, :] + tl.zeros((BLOCK_M, KP), tl.int32)
    va = tl.where(slots < TOPK, float("-inf"), float("inf"))  # slots >= TOPK: never the minimum
    vb = va
    ta = -1 - slots  # distinct ids for the empty slots (evicted in turn)
    tb = ta
    for v0 in range(0, V, BLOCK_N):
        cols = v0 + tl.arange(0, BLOCK_N)
        cmask = cols < V
        l, m = _tile_logits(HA, HB, W, WB, rows, cols, rmask, cmask, K, s_ha, s_hb, s_w, s_wb,
                            SHARED_W, UPCAST, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
        dlm = tl.where(cmask[None, :], l - m, 0.0)  # before masking: no inf - inf
        l = tl.where(cmask[None, :], l, float("-inf"))
        m = tl.where(cmask[None, :], m, float("-inf"))
        tl_max = tl.max(l, 1)
        tm_max = tl.max(m, 1)
        if v0 == 0:
            c = tl_max - tm_max  # centring constant for x = d - c (any constant is exact)
        t_ia = tl.argmax(l, 1, tie_break_left=True).to(tl.int32) + v0
        t_ib = tl.argmax(m, 1, tie_break_left=True).to(tl.int32) + v0
        t_mt = tl.sum(tl.where(cols[None, :] == t_ia[:, None], m, 0.0), 1)
        mt = tl.where(tl_max > a, t_mt, mt)
        ia = tl.where(tl_max > a, t_ia, ia)  # strictly greater: ties keep the lower id
        ib = tl.where(tm_max > b, t_ib, ib)
        a_new = tl.maximum(a, tl_max)
        b_new = tl.maximum(b, tm_max)
        alpha = tl.exp(a - a_new)
        beta = tl.exp(b - b_new)
        la = l - a_new[:, None]  # -inf on masked columns
        lm = m - b_new[:, None]
        wl = tl.exp(la)
        wm = tl.exp(lm)
        x = tl.where(cmask[None, :], dlm - c[:, None], 0.0)
        term = tl.where(x < -1.0, tl.exp(la - x) - wl + wl * x, wl * _phi(x))
        xr = -x  # the reverse KL: the same form with the roles of l and m exchanged
        term_r = tl.where(xr < -1.0, tl.exp(lm - xr) - wm + wm * xr, wm * _phi(xr))
        first = a == float("-inf")  # nothing accumulated yet (avoid 0 * inf)
        E = tl.where(first, 0.0, alpha * (E + tl.where(first, 0.0, a_new - a) * S))
        E += tl.sum(-wl * tl.where(cmask[None, :], la, 0.0), 1)
        S = S * alpha + tl.sum(wl, 1)
        F = F * alpha + tl.sum(term, 1)
        R = R * beta + tl.sum(wm, 1)
        G = G * beta + tl.sum(term_r, 1)
        a = a_new
        b = b_new
        va, ta = _topk_merge(va, ta, l, cols, TOPK)
        vb, tb = _topk_merge(vb, tb, m, cols, TOPK)
        hit = cols[None, :] == y[:, None]
        ly += tl.sum(tl.where(hit, l, 0.0), 1)
        my += tl.sum(tl.where(hit, m, 0.0), 1)
    base = OUT_F + rows * 11
    tl.store(base + 8, E, mask=rmask)
    tl.store(base + 9, G, mask=rmask)
    tl.store(base + 10, mt, mask=rmask)
    sl = tl.arange(0, KP)[None, :]
    tmask = rmask[:, None] & (sl < TOPK)
    tl.store(OUT_T + rows[:, None] * (4 * TOPK) + sl, ta, mask=tmask)
    tl.store(OUT_T + rows[:, None] * (4 * TOPK) + TOPK + sl, tb, mask=tmask)
    tl.store(OUT_T + rows[:, None] * (4 * TOPK) + 2 * TOPK + sl, va.to(tl.int32, bitcast=True), mask=tmask)
    tl.store(OUT_T + rows[:, None] * (4 * TOPK) + 3 * TOPK + sl, vb.to(tl.int32, bitcast=True), mask=tmask)
    tl.store(base + 0, a, mask=rmask)
    tl.store(base + 1, S, mask=rmask)
    tl.store(base + 2, b, mask=rmask)
    tl.store(base + 3, R, mask=rmask)
    tl.store(base + 4, F, mask=rmask)
    tl.store(base + 5, ly, mask=rmask)
    tl.store(base + 6, my, mask=rmask)
    tl.store(base + 7, c, mask=rmask)
    tl.store(OUT_I + rows * 2 + 0, ia, mask=rmask)
    tl.store(OUT_I + rows * 2 + 1, ib, mask=rmask)


@triton.jit
def _phase2_kernel(HA, HB, W, WB, ROWP, OUT, N, V, K, s_ha, s_hb, s_w, s_wb,
                   SHARED_W: tl.constexpr, UPCAST: tl.constexpr, EVEN_K: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < N
    a = tl.load(ROWP + rows * 4 + 0, mask=rmask, other=0.0)
    b = tl.load(ROWP + rows * 4 + 1, mask=rmask, other=0.0)
    kk = tl.load(ROWP + rows * 4 + 2, mask=rmask, other=0.0)  # ln S - ln R (rounded from float64)
    ratio = tl.load(ROWP + rows * 4 + 3, mask=rmask, other=1.0)  # S / R
    sp = tl.zeros((BLOCK_M,), tl.float32)
    smin = tl.zeros((BLOCK_M,), tl.float32)
    jmin = tl.zeros((BLOCK_M,), tl.float32)
    jsum = tl.zeros((BLOCK_M,), tl.float32)
    for v0 in range(0, V, BLOCK_N):
        cols = v0 + tl.arange(0, BLOCK_N)
        cmask = cols < V
        l, m = _tile_logits(HA, HB, W, WB, rows, cols, rmask, cmask, K, s_ha, s_hb, s_w, s_wb,
                            SHARED_W, UPCAST, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
        X = l - a[:, None]
        Yc = m - b[:, None]
        P = tl.where(cmask[None, :], tl.exp(X), 0.0)
        Q = tl.where(cmask[None, :], tl.exp(Yc) * ratio[:, None], 0.0)
        d = tl.where(cmask[None, :], (X - Yc) - kk[:, None], 0.0)
        ad = tl.abs(d)
        mn = tl.minimum(P, Q)
        em = _expm1(-ad)
        s = -em / (2.0 + em)  # tanh(|d| / 2)
        sp += tl.sum(P, 1)
        smin += tl.sum(mn, 1)
        jmin += tl.sum(mn * ad, 1)
        jsum += tl.sum((P + Q) * _log1p(s), 1)
    base = OUT + rows * 4
    tl.store(base + 0, smin, mask=rmask)
    tl.store(base + 1, jmin, mask=rmask)
    tl.store(base + 2, jsum, mask=rmask)
    tl.store(base + 3, sp, mask=rmask)


def _prep(ref_hidden: torch.Tensor, cand_hidden: torch.Tensor, head: torch.Tensor, cand_head: torch.Tensor | None,
          dev: torch.device) -> tuple[torch.Tensor, ...]:
    w = head.to(dev).contiguous()
    wb = cand_head.to(dev, w.dtype).contiguous() if cand_head is not None else w
    ha = ref_hidden.to(dev, w.dtype).contiguous()
    hb = cand_hidden.to(dev, w.dtype).contiguous()
    return ha, hb, w, wb


def _env_blocks() -> tuple[int, int, int, int, int] | None:
    """``FIDELITY_FUSED_BLOCKS="BM,BN,BK,warps,stages"`` overrides the CUDA default (tuning without a code change)."""
    import os

    spec = os.environ.get("FIDELITY_FUSED_BLOCKS")
    if not spec:
        return None
    parts = tuple(int(x) for x in spec.split(","))
    if len(parts) != 5:
        raise ValueError(f"FIDELITY_FUSED_BLOCKS: expected BM,BN,BK,warps,stages, found {spec!r}")
    a, b, c, d, e = parts
    return a, b, c, d, e


def _launch_args(blocks: tuple[int, int, int, int, int] | None, dev: torch.device, w: torch.Tensor, K: int) -> JSONObject:
    interp = interpreting()
    if blocks is None and not interp and dev.type == "cuda":
        blocks = _env_blocks()
    bm, bn, bk, nw, ns = blocks or DEFAULT_BLOCKS["interpret" if interp or dev.type != "cuda" else "cuda"]
    upcast = interp or w.dtype == torch.float32
    kw: dict[str, Any] = dict(UPCAST=upcast, EVEN_K=(K % bk == 0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
    if not interp:
        kw.update(num_warps=nw, num_stages=ns)
    return kw


def phase1(ha: torch.Tensor, hb: torch.Tensor, w: torch.Tensor, wb: torch.Tensor, targets: torch.Tensor,
           blocks: tuple[int, int, int, int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run phase 1; returns per-row fp32 ``[N, 11]`` (a, S, b, R, F, l_y, m_y, c, E, G, m_top), int32
    ``[N, 2]`` argmaxes and int32 ``[N, 4, TOPK]``: the top-k token ids of reference and candidate, then
    their logits (fp32 bits), each list unordered."""
    n, k = ha.shape
    v = w.shape[0]
    dev = ha.device
    if v < TOPK:
        raise ValueError(f"fused Triton scorer: vocabulary {v} is smaller than the top-{TOPK} it keeps; use backend='torch'")
    out_f = torch.empty(n, 11, dtype=torch.float32, device=dev)
    out_i = torch.empty(n, 2, dtype=torch.int32, device=dev)
    out_t = torch.empty(n, 4, TOPK, dtype=torch.int32, device=dev)
    kw = _launch_args(blocks, dev, w, k)
    y = targets.to(dev, torch.int32).contiguous()
    grid = (triton.cdiv(n, kw["BLOCK_M"]),)
    _phase1_kernel[grid](ha, hb, w, wb, y, out_f, out_i, out_t, n, v, k, ha.stride(0), hb.stride(0), w.stride(0),
                         wb.stride(0), SHARED_W=wb is w, TOPK=TOPK, KP=triton.next_power_of_2(TOPK), **kw)
    return out_f, out_i, out_t


def phase2(ha: torch.Tensor, hb: torch.Tensor, w: torch.Tensor, wb: torch.Tensor, rowp: torch.Tensor,
           blocks: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """Run phase 2 with per-row fp32 ``[N, 4]`` (a, b, ln S - ln R, S / R); returns fp32 ``[N, 4]``
    (sum min, sum min |d|, sum (P+Q) log1p(s), sum P)."""
    n, k = ha.shape
    v = w.shape[0]
    dev = ha.device
    out = torch.empty(n, 4, dtype=torch.float32, device=dev)
    kw = _launch_args(blocks, dev, w, k)
    grid = (triton.cdiv(n, kw["BLOCK_M"]),)
    _phase2_kernel[grid](ha, hb, w, wb, rowp.contiguous(), out, n, v, k, ha.stride(0), hb.stride(0), w.stride(0),
                         wb.stride(0), SHARED_W=wb is w, **kw)
    return out


def _ordered_topk(top: torch.Tensor) -> np.ndarray:
    """``[N, 2, TOPK]`` token ids of both sides ordered by logit (descending), ties by id (ascending),
    from phase 1's unordered ids and fp32 logit bits."""
    ids = top[:, :2].numpy().astype(np.int64)
    vals = top[:, 2:].contiguous().view(torch.float32).numpy().astype(np.float64)
    order = np.lexsort((ids, -vals), axis=-1)
    ordered: np.ndarray = np.take_along_axis(ids, order, axis=-1)
    return ordered


def fused_score(
    ref_hidden: torch.Tensor,
    cand_hidden: torch.Tensor,
    head: torch.Tensor,
    targets: torch.Tensor,
    cand_head: torch.Tensor | None = None,
    *,
    device: str | torch.device | None = None,
    jsd_ear: bool = True,
    blocks: tuple[int, int, int, int, int] | None = None,
    fallback: bool = True,
) -> PositionScores:
    """Score ``[N, H]`` hidden states through ``[V, H]`` head(s) with the fused kernel.

    Returns :class:`harness.scoring.scorer.PositionScores`. Inputs are assumed checked by the caller
    (:func:`harness.scoring.scorer.score_hidden`). ``jsd_ear=False`` skips phase 2 (JSD, EAR are NaN).
    """
    dev = torch.device(device) if device is not None else head.device
    if dev.type != "cuda" and not interpreting():
        raise ValueError(f"fused Triton scorer: device {dev} needs CUDA (or TRITON_INTERPRET=1 set before triton is "
                         "imported, for tests); use backend='torch' here")
    n = ref_hidden.shape[0]
    if n == 0:
        return PositionScores.empty(0)
    with torch.inference_mode():
        ha, hb, w, wb = _prep(ref_hidden, cand_hidden, head, cand_head, dev)
        st, am, top = phase1(ha, hb, w, wb, targets, blocks)
        s64 = st.double()
        a, S, b, R, F, ly, my, c, E, G, mt = s64.unbind(1)
        lnS, lnR = S.log(), R.log()
        lse_l, lse_m = a + lnS, b + lnR
        Z = (b - a + c) + (lnR - lnS)
        kld = (F / S + (Z - torch.expm1(Z))).clamp_min(0.0)
        kld_rev = (G / R + (-Z - torch.expm1(-Z))).clamp_min(0.0)
        out = PositionScores.empty(n)
        if jsd_ear:
            rowp = torch.stack([a, b, lnS - lnR, S / R], 1).float()
            j = phase2(ha, hb, w, wb, rowp, blocks).double()
            smin, jmin, jsum, sp = j.unbind(1)  # sp: sum P in phase 2's order (identical inputs: EAR == 1)
            out.jsd_bits[:] = (0.5 * (jsum - jmin) / sp / _LN2).cpu().numpy()
            out.ear[:] = (smin / sp).clamp(0.0, 1.0).cpu().numpy()
        else:
            out.jsd_bits[:] = np.nan
            out.ear[:] = np.nan
        out.kld[:] = kld.cpu().numpy()
        out.nll_ref[:] = (lse_l - ly).cpu().numpy()
        out.nll_cand[:] = (lse_m - my).cpu().numpy()
        ami = am.long().cpu().numpy()
        out.argmax_ref[:] = ami[:, 0]
        out.argmax_cand[:] = ami[:, 1]
        out.kld_rev[:] = kld_rev.cpu().numpy()
        out.entropy_ref[:] = (lnS + E / S).cpu().numpy()
        out.p_ref_top[:] = (1.0 / S).cpu().numpy()
        out.q_ref_top[:] = (torch.exp(mt - b) / R).cpu().numpy()
        tops = _ordered_topk(top.cpu())
        for k, field in zip(TOPK_REPORTED, (out.top5_overlap, out.top10_overlap)):
            field[:] = (tops[:, 0, :k, None] == tops[:, 1, None, :k]).any(2).sum(1)
    bad = ~np.isfinite(out.kld) | ~np.isfinite(out.nll_ref) | ~np.isfinite(out.nll_cand) | ~np.isfinite(out.kld_rev)
    bad |= ~np.isfinite(out.entropy_ref) | ~np.isfinite(out.q_ref_top)
    if jsd_ear:
        bad |= ~np.isfinite(out.jsd_bits) | ~np.isfinite(out.ear)
    if fallback and bad.any():  # pathological logit ranges (module docstring): rescore those rows exactly
        idx = torch.from_numpy(np.nonzero(bad)[0])
        sub = score_hidden_tiled(ref_hidden[idx], cand_hidden[idx], head, targets[idx], cand_head, device=dev)
        for name, arr in sub.to_dict().items():
            getattr(out, name)[bad] = arr
    return out
