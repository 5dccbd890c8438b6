"""Exact full-vocabulary scorer: KL, JSD, EAR, NLLs and top-1 per position, on any torch device.

Per position, with p = softmax(reference logits) and q = softmax(candidate logits) over the *whole*
vocabulary (never top-k): KL(p||q) in nats, the Jensen-Shannon divergence in bits, EAR = sum min(p, q),
the negative log-likelihoods of the true next token under both, and both argmaxes (ties to the lowest
token id). Each tile's logits are computed once, in fp32 from bf16 operands (:func:`logits_gemm`), and
every metric is taken from them in cache-sized chunks (:func:`_metrics_chunk`); memory does not grow
with the number of positions. Identical inputs give KLD == 0 and EAR == 1 exactly. How it is computed
and why (GEMM, chunking, the fused metric kernel, the cancellation-free forms): docs/design.md,
section 6, "The exact scorer".
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import torch

from harness.metrics.scores import PositionScores
from harness.scoring import cblas_bf16, metric_kernel
from harness.scoring.gemm import BF16_OPERAND_PATHS, choose_gemm, gemm_mode
from harness.scoring.groups import score_groups

__all__ = [
    "PositionScores",
    "check_hidden_inputs",
    "score_hidden_tiled",
    "score_logits",
    "score_two_pass",
    "bare_gemms",
    "default_tile_rows",
    "gemm_path",
    "logits_tiles",
    "balanced_tile_rows",
    "tile_plan",
    "TilePlan",
    "shard_tiles",
    "ShardTile",
    "MEMORY_BUDGET_BYTES",
]

#: Memory budget for the two logits tiles of one GEMM tile (the dominant buffers). 1 GiB gives
#: 2 x 512 rows at a 248,320-token vocabulary: enough rows per head pass that the GEMM is not
#: bound by streaming the head (docs/performance.md); nothing grows with the number of positions.
MEMORY_BUDGET_BYTES = 1024 * 1024 * 1024
#: Budget for the six fp32 metric buffers on a CPU (about an L2/L3 slice).
CPU_CHUNK_BYTES = 6 * 1024 * 1024
#: Logits (both sides, fp32) per call of the compiled metric kernel on a CPU: the chunk is read
#: from memory once and stays in the last-level cache while its top-k sets and gathers reread it.
COMPILED_CHUNK_BYTES = 8 * 1024 * 1024
_LN2 = math.log(2.0)


def default_tile_rows(vocab: int, logits_itemsize: int = 2, budget: int = MEMORY_BUDGET_BYTES) -> int:
    """Rows per GEMM tile so that the two logits tiles fit in ``budget`` bytes (16..1024, multiple of 16)."""
    rows = budget // max(1, 2 * vocab * logits_itemsize)
    rows = max(16, min(1024, rows))
    return int(rows // 16 * 16)


def _default_chunk_rows(vocab: int, device: torch.device, tile_rows: int, compiled: bool = False) -> int:
    if device.type != "cpu":
        return tile_rows
    if compiled:  # both sides' fp32 logits of the chunk, at least one row per thread
        rows = max(torch.get_num_threads(), COMPILED_CHUNK_BYTES // (2 * 4 * vocab))
        return int(max(1, min(tile_rows, rows)))
    return int(max(1, min(tile_rows, CPU_CHUNK_BYTES // (6 * 4 * vocab))))



@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


class _Workspace:
    """Six fp32 buffers of ``chunk_rows x vocab``, allocated once per call."""

    def __init__(self, chunk_rows: int, vocab: int, device: torch.device) -> None:
        self.bufs = [torch.empty(chunk_rows, vocab, dtype=torch.float32, device=device) for _ in range(6)]

    def view(self, rows: int) -> list[torch.Tensor]:
        return [b[:rows] for b in self.bufs]


#: The top-k overlaps the scorer reports (``PositionScores.top5_overlap``, ``top10_overlap``).
TOPK = (5, 10)
#: Columns per block of :func:`_topk_ids`'s first pass.
_TOPK_BLOCK = 64


def _topk_ids(x: torch.Tensor, k: int) -> torch.Tensor:
    """Token ids of the ``k`` largest entries of each row of ``x``, largest first (``torch.topk``'s order).

    Two cheap passes instead of a top-k over the whole row: the maxima of blocks of
    :data:`_TOPK_BLOCK` columns, then a top-k over the ``k`` blocks with the largest maxima (and the
    tail that fills no block). Exact: a block holding one of the k largest entries has a maximum at
    least the k-th largest value, and at most k blocks hold such an entry, so the k blocks with the
    largest maxima hold a set of k largest entries.
    """
    rows, vocab = x.shape
    nb = vocab // _TOPK_BLOCK
    if nb <= k or not x.is_contiguous():
        return torch.topk(x, k, dim=1, sorted=True).indices
    bmax = x[:, : nb * _TOPK_BLOCK].view(rows, nb, _TOPK_BLOCK).amax(2)
    blocks = torch.topk(bmax, k, dim=1, sorted=False).indices
    ids = (blocks[:, :, None] * _TOPK_BLOCK + torch.arange(_TOPK_BLOCK, device=x.device)).reshape(rows, -1)
    if vocab > nb * _TOPK_BLOCK:
        tail = torch.arange(nb * _TOPK_BLOCK, vocab, device=x.device).expand(rows, -1)
        ids = torch.cat([ids, tail], dim=1)
    pick = torch.topk(x.gather(1, ids), k, dim=1, sorted=True).indices
    return ids.gather(1, pick)



def _metrics_chunk(
    ref: torch.Tensor,
    cand: torch.Tensor,
    targets: torch.Tensor,
    ws: _Workspace,
    out: PositionScores,
    start: int,
) -> None:
    """All metrics for one chunk of rows of logits (any float dtype), written to ``out[start:]``.

    This is the scorer's whole per-tile metric pass: it reads the two logits tiles and never
    multiplies by the head (the GEMMs that produce the tiles are the caller's).

    Notation: x, y = reference and candidate logits; X = x - max x, Y = y - max y (fp32, exact
    for bf16/fp16 logits); P = exp(X), Q = exp(Y) (unnormalized); s_a, s_b their row sums
    (float64). Then d = ln p - ln q = (X - Y) - (ln s_a - ln s_b): the normalizers cancel in
    float64 before anything is rounded to fp32, so d is accurate even when the divergence is tiny.

    From the same buffers: H(p) = ln s_a + sum P (-X) / s_a (two non-negative terms, no
    cancellation); p(argmax p) = 1 / s_a (the maximal term of P is exp(0)); q(argmax p) =
    exp(Y[argmax p]) / s_b; KL(q||p) = -sum (Q s_a / s_b) d / s_a (Q rescaled to P's scale, the
    same d as the forward KL, so identical inputs give exactly 0); the top-k sets from
    ``torch.topk`` of the logits.
    """
    rows, vocab = ref.shape
    X, Y, P, Q, A, B = ws.view(rows)
    mx_a, am_a = torch.max(ref, dim=1)  # first maximal index: ties go to the lowest token id
    mx_b, am_b = torch.max(cand, dim=1)
    k_max = min(max(TOPK), vocab)
    top_a = _topk_ids(ref, k_max)
    top_b = _topk_ids(cand, k_max)
    torch.sub(ref, mx_a[:, None].float(), out=X)  # x - max x, fp32 (exact for bf16/fp16 logits)
    torch.exp(X, out=P)
    torch.sub(cand, mx_b[:, None].float(), out=Y)
    torch.exp(Y, out=Q)
    s_a = P.sum(1, dtype=torch.float64)
    s_b = Q.sum(1, dtype=torch.float64)
    ln_a = s_a.log()
    ln_b = s_b.log()
    yi = targets.view(-1, 1)
    nll_a = ln_a - X.gather(1, yi).view(-1).double()
    nll_b = ln_b - Y.gather(1, yi).view(-1).double()
    y_top = Y.gather(1, am_a.view(-1, 1)).view(-1).double()  # candidate logit (shifted) at the reference's argmax
    ent_neg = torch.mul(P, X, out=A).sum(1, dtype=torch.float64)  # sum P X <= 0
    X.sub_(Y).sub_((ln_a - ln_b).float()[:, None])  # X := d = ln p - ln q (exactly 0 where inputs agree)
    Q.mul_((s_a / s_b).float()[:, None])  # Q := q * s_a, on the same scale as P = p * s_a
    kld = torch.mul(P, X, out=Y).sum(1, dtype=torch.float64)
    rev_neg = torch.mul(Q, X, out=Y).sum(1, dtype=torch.float64)  # sum q s_a d = -s_a KL(q||p)
    torch.minimum(P, Q, out=A)
    s_min = A.sum(1, dtype=torch.float64)
    torch.abs(X, out=B)  # a = |d|
    j_min = torch.mul(A, B, out=Y).sum(1, dtype=torch.float64)  # sum min * a
    torch.neg(B, out=X)
    X.expm1_()  # em = expm1(-a) in [-1, 0]
    torch.add(X, 2.0, out=Y)
    X.div_(Y).neg_()  # s = tanh(a / 2) in [0, 1]
    X.log1p_()
    P.add_(Q)
    j_sum = torch.mul(P, X, out=Y).sum(1, dtype=torch.float64)  # sum (p + q) * log1p(s)

    stats = torch.stack([kld, s_a, s_min, j_min, j_sum, nll_a, nll_b, rev_neg, ent_neg, ln_a, y_top, s_b])
    _write_scores(stats, am_a, am_b, top_a, top_b, k_max, out, start)


def _metrics_chunk_compiled(ref: torch.Tensor, cand: torch.Tensor, targets: torch.Tensor, out: PositionScores,
                            start: int) -> None:
    """:func:`_metrics_chunk` with the elementwise/reduction chain in one compiled kernel
    (:func:`harness.scoring.metric_kernel.row_stats`, the same formulas); the gathers at the target
    and argmax columns and the top-k sets are eager (exact index operations)."""
    ref, cand = ref.float(), cand.float()
    st, mx_a, mx_b = metric_kernel.compiled_row_stats(ref, cand)
    kld, s_a, s_min, j_min, j_sum, rev_neg, ent_neg, ln_a, s_b = st
    k_max = min(max(TOPK), ref.shape[1])
    top_a = _topk_ids(ref, k_max)
    top_b = _topk_ids(cand, k_max)
    am_a = metric_kernel.argmax_from_top(ref, top_a, mx_a)
    am_b = metric_kernel.argmax_from_top(cand, top_b, mx_b)
    yi = targets.view(-1, 1)
    nll_a = ln_a - (ref.gather(1, yi).view(-1) - mx_a).double()  # X[t], X = x - max x in fp32 as in the eager pass
    nll_b = s_b.log() - (cand.gather(1, yi).view(-1) - mx_b).double()
    y_top = (cand.gather(1, am_a.view(-1, 1)).view(-1) - mx_b).double()
    stats = torch.stack([kld, s_a, s_min, j_min, j_sum, nll_a, nll_b, rev_neg, ent_neg, ln_a, y_top, s_b])
    _write_scores(stats, am_a, am_b, top_a, top_b, k_max, out, start)


def _write_scores(stats: torch.Tensor, am_a: torch.Tensor, am_b: torch.Tensor, top_a: torch.Tensor,
                  top_b: torch.Tensor, k_max: int, out: PositionScores, start: int) -> None:
    """Turn one chunk's per-row float64 statistics into its scores in ``out[start:]`` (shared by both metric passes)."""
    sl = slice(start, start + stats.shape[1])
    kld_n, sa_n, smin_n, jmin_n, jsum_n, nlla_n, nllb_n, revn_n, entn_n, lna_n, ytop_n, sb_n = stats.cpu().numpy()
    out.kld[sl] = kld_n / sa_n
    out.jsd_bits[sl] = 0.5 * (jsum_n - jmin_n) / sa_n / _LN2
    out.ear[sl] = np.clip(smin_n / sa_n, 0.0, 1.0)
    out.nll_ref[sl] = nlla_n
    out.nll_cand[sl] = nllb_n
    out.argmax_ref[sl] = am_a.cpu().numpy()
    out.argmax_cand[sl] = am_b.cpu().numpy()
    out.kld_rev[sl] = -revn_n / sa_n
    out.entropy_ref[sl] = lna_n - entn_n / sa_n
    out.p_ref_top[sl] = 1.0 / sa_n
    out.q_ref_top[sl] = np.exp(ytop_n) / sb_n
    for k, field in zip(TOPK, (out.top5_overlap, out.top10_overlap)):
        kk = min(k, k_max)
        shared = (top_a[:, :kk, None] == top_b[:, None, :kk]).any(2).sum(1)
        field[sl] = shared.cpu().numpy()


class _MetricRunner:
    """Runs :func:`_metrics_chunk` over the chunks of a logits tile.

    On a CPU with T > 1 torch threads, T Python worker threads each run whole chunks with
    single-threaded torch ops (torch releases the GIL), instead of splitting every small
    elementwise op across T OpenMP threads: ~20 synchronizations per chunk otherwise, which
    cost a scheduler time slice each when the cores are shared. The GEMMs keep all T threads.

    ``compiled``: the chunks go through :func:`_metrics_chunk_compiled` in the calling thread
    instead (the compiled kernel holds the GIL and splits its rows over OpenMP threads itself).
    """

    def __init__(self, chunk_rows: int, vocab: int, device: torch.device, compiled: bool = False) -> None:
        self.chunk = chunk_rows
        self.compiled = compiled
        threads = torch.get_num_threads() if device.type == "cpu" and not compiled else 1
        self.workers = max(1, threads)
        self.spaces = [] if compiled else [_Workspace(chunk_rows, vocab, device) for _ in range(self.workers)]
        self.pool: Any = None
        if self.workers > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(self.workers, initializer=torch.set_num_threads, initargs=(1,))

    def __enter__(self) -> _MetricRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def _work(self, k: int, la: torch.Tensor, lb: torch.Tensor, t: torch.Tensor, out: PositionScores, start: int) -> None:
        with torch.inference_mode():
            m = la.shape[0]
            for c0 in range(k * self.chunk, m, self.chunk * self.workers):
                c1 = min(m, c0 + self.chunk)
                if self.compiled:
                    _metrics_chunk_compiled(la[c0:c1], lb[c0:c1], t[c0:c1], out, start + c0)
                else:
                    _metrics_chunk(la[c0:c1], lb[c0:c1], t[c0:c1], self.spaces[k], out, start + c0)

    def run(self, la: torch.Tensor, lb: torch.Tensor, t: torch.Tensor, out: PositionScores, start: int) -> None:
        if self.pool is None:
            self._work(0, la, lb, t, out, start)
            return
        futs = [self.pool.submit(self._work, k, la, lb, t, out, start) for k in range(self.workers)]
        for f in futs:
            f.result()



def _mm_out_dtype_works(dev: torch.device) -> bool:
    """Whether ``torch.mm(bf16, bf16, out_dtype=float32)`` runs on ``dev`` (CUDA in recent torch)."""
    key = str(dev)
    if key not in _OUT_DTYPE_CACHE:
        try:
            a = torch.ones(2, 2, dtype=torch.bfloat16, device=dev)
            ok = torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, TypeError, NotImplementedError):
            ok = False
        _OUT_DTYPE_CACHE[key] = ok
    return _OUT_DTYPE_CACHE[key]


_OUT_DTYPE_CACHE: dict[str, bool] = {}


def gemm_path(dev: torch.device, *operands: torch.Tensor | None) -> str:
    """The GEMM path (:mod:`harness.scoring.gemm`) the torch scorer uses for these operands on ``dev``."""
    dtypes = tuple(t.dtype for t in operands if t is not None)
    return choose_gemm(dev, dtypes, dev.type != "cpu" and _mm_out_dtype_works(dev))


def gemm_operand(head: torch.Tensor, dev: torch.device, path: str | None = None) -> torch.Tensor:
    """The head as the GEMM will use it on ``dev``: kept in bf16/fp16 on the paths that take bf16
    operands as they are (:data:`harness.scoring.gemm.BF16_OPERAND_PATHS`: CUDA ``out_dtype``,
    MKL's bf16 GEMM), else widened once to fp32 (exact). ``path`` defaults to :func:`gemm_path`
    for the head alone."""
    w = head.to(dev)
    chosen = path if path is not None else gemm_path(dev, w)
    if w.dtype in (torch.bfloat16, torch.float16) and chosen in BF16_OPERAND_PATHS:
        return w
    return w.float()


def logits_gemm(hidden: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """fp32 logits ``hidden @ w.T`` into ``out`` (fp32; may be a column slice of a wider buffer on a
    CPU): products of the operands' exact values, accumulated in fp32, never rounded to bf16 (see
    the module docstring). A bf16 ``w`` on a CPU goes through MKL's bf16 GEMM
    (:mod:`harness.scoring.cblas_bf16`) when ``hidden`` is bf16 too, else both are widened."""
    h = hidden.to(out.device)
    if w.dtype == torch.float32:
        return torch.mm(h.to(w.dtype), w.t(), out=out)
    if out.device.type == "cpu":
        if w.dtype == torch.bfloat16 and h.dtype == torch.bfloat16 and cblas_bf16.available():
            return cblas_bf16.gemm_bf16_f32(h if h.stride(-1) == 1 else h.contiguous(), w, out)
        return torch.mm(h.float(), w.float().t(), out=out)
    out.copy_(torch.mm(h.to(w.dtype), w.t(), out_dtype=torch.float32))
    return out


def _check_targets(targets: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    if targets.ndim != 1 or targets.shape[0] != n:
        raise ValueError(f"targets: expected shape [{n}], found {list(targets.shape)}")
    t = targets.to(torch.int64)
    if n and (int(t.min()) < 0 or int(t.max()) >= vocab):
        raise ValueError(f"targets: expected token ids in [0, {vocab}), found range [{int(t.min())}, {int(t.max())}]")
    return t


def _resolve_device(device: str | torch.device | None, like: torch.Tensor) -> torch.device:
    return torch.device(device) if device is not None else like.device


def check_hidden_inputs(
    ref_hidden: torch.Tensor,
    cand_hidden: torch.Tensor,
    head: torch.Tensor,
    targets: torch.Tensor,
    cand_head: torch.Tensor | None,
    device: str | torch.device | None,
) -> tuple[int, int, torch.device, torch.Tensor]:
    """Check shapes and token ids; returns ``(N, vocab, device, int64 targets)``."""
    if ref_hidden.ndim != 2 or ref_hidden.shape != cand_hidden.shape:
        raise ValueError(
            f"hidden states: expected two [N, H] tensors of equal shape, found {list(ref_hidden.shape)} "
            f"and {list(cand_hidden.shape)}"
        )
    n, hdim = ref_hidden.shape
    if head.ndim != 2 or head.shape[1] != hdim:
        raise ValueError(f"head: expected [V, {hdim}], found {list(head.shape)}")
    if cand_head is not None and cand_head.shape != head.shape:
        raise ValueError(f"cand_head: expected {list(head.shape)}, found {list(cand_head.shape)}")
    vocab = head.shape[0]
    dev = _resolve_device(device, head)
    t_all = _check_targets(targets, n, vocab)
    return n, vocab, dev, t_all


def score_hidden_tiled(
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
    compiled: bool | None = None,
) -> PositionScores:
    """The tiled torch path of :func:`harness.scoring.scorer.score_hidden` (same arguments, no backend choice).

    Each hidden state is multiplied by the head exactly once; see the module docstring. ``compiled``: whether the
    metric pass runs compiled (None: :func:`tile_plan`'s choice for these rows).
    """
    n, vocab, dev, t_all = check_hidden_inputs(ref_hidden, cand_hidden, head, targets, cand_head, device)
    out = PositionScores.empty(n)
    if n == 0:
        return out
    path = gemm_path(dev, ref_hidden, cand_hidden, head, cand_head)
    with _threads(threads), torch.inference_mode(), gemm_mode(path):
        plan = tile_plan(n, vocab, dev, tile_rows=tile_rows, chunk_rows=chunk_rows, compiled=compiled)
        tile, chunk, compiled = plan.tile, plan.chunk, plan.compiled
        t_dev = t_all.to(dev)
        with _MetricRunner(chunk, vocab, dev, compiled) as runner:
            for r0, la, lb in logits_tiles(ref_hidden, cand_hidden, head, cand_head, tile, dev, path):
                runner.run(la, lb, t_dev[r0 : r0 + la.shape[0]], out, r0)
    return out


class TilePlan(NamedTuple):
    """How :func:`score_hidden_tiled` cuts ``n`` rows: ``tile`` rows per GEMM tile (the last may be shorter),
    ``chunk`` rows per metric chunk, and whether the metric pass runs ``compiled``. A tile's scores depend only
    on its rows and this plan, so scoring the tiles one call each with ``tile_rows`` = the tile's length,
    ``chunk_rows`` = ``chunk`` and ``compiled`` gives the same numbers as one call over all rows."""

    tile: int
    chunk: int
    compiled: bool

    def bounds(self, n: int) -> list[tuple[int, int]]:
        """``(first row, end row)`` of each tile of ``n`` rows."""
        return [(r0, min(n, r0 + self.tile)) for r0 in range(0, n, self.tile)]


def tile_plan(n: int, vocab: int, dev: torch.device, *, tile_rows: int | None = None, chunk_rows: int | None = None,
              compiled: bool | None = None) -> TilePlan:
    """The tiling :func:`score_hidden_tiled` uses for ``n`` rows over a ``vocab``-row head on ``dev``."""
    tile = balanced_tile_rows(n, int(tile_rows or default_tile_rows(vocab, 4)), exact=tile_rows is not None)
    comp = metric_kernel.use_compiled(n, vocab, dev) if compiled is None else compiled
    chunk = min(int(chunk_rows or _default_chunk_rows(vocab, dev, tile, comp)), tile)
    return TilePlan(tile, chunk, comp)


class ShardTile(NamedTuple):
    """Rows ``[r0, r1)`` of a shard (rows in context order) that one :func:`score_hidden_tiled` call scores as one
    tile, with the metric plan of its group (``chunk``, ``compiled``: :class:`TilePlan`)."""

    r0: int
    r1: int
    chunk: int
    compiled: bool


def shard_tiles(n_contexts: int, rows: int, width: int, head: torch.Tensor, device: str,
                tile_rows: int | None = None) -> list[ShardTile]:
    """The tiles a hidden-state shard of ``n_contexts`` contexts is scored in by
    :func:`harness.run.shard.shard_positions`: its groups (:func:`harness.scoring.streaming.score_groups`: the
    whole shard, or streamed chunks), each cut by :func:`tile_plan` (``tile_rows``: a fixed tile, as
    :func:`score_hidden_tiled` takes it). Scoring each alone with its plan gives the numbers of the whole."""
    dev = torch.device(device)
    out: list[ShardTile] = []
    start = 0
    for group in score_groups(list(range(n_contexts)), rows, width, head.element_size()):
        n = len(group) * rows
        plan = tile_plan(n, int(head.shape[0]), dev, tile_rows=tile_rows)
        out += [ShardTile(start + a, start + b, plan.chunk, plan.compiled) for a, b in plan.bounds(n)]
        start += n
    return out


#: GEMM paths on which both sides of a tile go through one stacked GEMM (see :func:`logits_tiles`).
_STACKED_PATHS = ("mkl-bf16-f32", "onednn-bf16")


def balanced_tile_rows(n: int, tile_max: int, exact: bool = False) -> int:
    """Rows per tile for ``n`` rows: at most ``tile_max``, as even as possible (2,047 rows at 540
    give 4 tiles of 512, not 3 of 540 and one of 427). ``exact`` keeps ``tile_max`` (a caller's choice)."""
    tile_max = max(1, min(tile_max, n))
    if exact:
        return tile_max
    k = -(-n // tile_max)
    return -(-n // k)


def logits_tiles(
    ref_hidden: torch.Tensor,
    cand_hidden: torch.Tensor,
    head: torch.Tensor,
    cand_head: torch.Tensor | None,
    tile: int,
    dev: torch.device,
    path: str,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(first row, reference logits, candidate logits)`` per tile of ``tile`` rows: fp32
    ``[m, vocab]`` views into two buffers reused across tiles (valid until the next tile).

    On the CPU's bf16 paths (:data:`_STACKED_PATHS`), with one shared head, the reference and
    candidate rows of a tile are stacked into one ``[2m, hidden]`` operand and multiplied in
    **one** GEMM, so the head -- 2.5 GB at 27B widths, far larger than any cache -- is streamed
    once per tile instead of twice; at hidden 5,120 the GEMM is bound by that stream unless a tile
    has several hundred rows (docs/performance.md). A candidate's own head, and the other paths,
    take two GEMMs (one per side, whose rows then do not depend on the other side's). This function is the only
    place the logits are produced; the metric pass (:func:`_metrics_chunk`) only reads them.
    """
    n = ref_hidden.shape[0]
    vocab = head.shape[0]
    w = gemm_operand(head, dev, path)
    logits = torch.empty(2 * tile, vocab, dtype=torch.float32, device=dev)
    stack = cand_head is None and ref_hidden.dtype == cand_hidden.dtype and path in _STACKED_PATHS
    w_c = w if cand_head is None else gemm_operand(cand_head, dev, path)
    both = torch.empty(2 * tile, ref_hidden.shape[1], dtype=ref_hidden.dtype, device=dev) if stack else None
    for r0 in range(0, n, tile):
        r1 = min(n, r0 + tile)
        m = r1 - r0
        if both is not None:
            both[:m].copy_(ref_hidden[r0:r1])
            both[m : 2 * m].copy_(cand_hidden[r0:r1])
            logits_gemm(both[: 2 * m], w, logits[: 2 * m])
        else:
            logits_gemm(ref_hidden[r0:r1], w, logits[:m])
            logits_gemm(cand_hidden[r0:r1], w_c, logits[m : 2 * m])
        yield r0, logits[:m], logits[m : 2 * m]


def score_logits(
    ref_logits: torch.Tensor,
    cand_logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    tile_rows: int | None = None,
    device: str | torch.device | None = None,
    threads: int | None = None,
) -> PositionScores:
    """Logits mode: score ``[N, V]`` logits or log-probs (softmax is shift-invariant) with the same metric code."""
    if ref_logits.ndim != 2 or ref_logits.shape != cand_logits.shape:
        raise ValueError(
            f"logits: expected two [N, V] tensors of equal shape, found {list(ref_logits.shape)} "
            f"and {list(cand_logits.shape)}"
        )
    n, vocab = ref_logits.shape
    dev = _resolve_device(device, ref_logits)
    t_all = _check_targets(targets, n, vocab)
    out = PositionScores.empty(n)
    if n == 0:
        return out
    with _threads(threads), torch.inference_mode():
        compiled = metric_kernel.use_compiled(n, vocab, dev)
        chunk = int(tile_rows or _default_chunk_rows(vocab, dev, 1024, compiled))
        chunk = min(chunk, n)
        t_dev = t_all.to(dev)
        with _MetricRunner(chunk, vocab, dev, compiled) as runner:
            for r0 in range(0, n, chunk * runner.workers):
                r1 = min(n, r0 + chunk * runner.workers)
                runner.run(ref_logits[r0:r1].to(dev), cand_logits[r0:r1].to(dev), t_dev[r0:r1], out, r0)
    return out


# --------------------------------------------------------------------------------------------
# Reference methods for the benchmark only (docs/design.md, section 6).


def score_two_pass(
    ref_hidden: torch.Tensor,
    cand_hidden: torch.Tensor,
    head: torch.Tensor,
    *,
    tile_rows: int | None = None,
    vocab_chunk: int = 16384,
    threads: int | None = None,
) -> np.ndarray:
    """Two-pass KLD (benchmark comparison only): pass 1 computes both normalizers by a running
    logsumexp over vocabulary chunks; pass 2 recomputes each chunk's logits and accumulates
    sum p (ln p - ln q). Memory is ``tile_rows x vocab_chunk``; the GEMMs run twice. Returns KLD
    per position (float64)."""
    n, _ = ref_hidden.shape
    vocab = head.shape[0]
    tile = int(tile_rows or default_tile_rows(vocab, 4))
    kld = np.zeros(n, dtype=np.float64)
    path = gemm_path(head.device, ref_hidden, cand_hidden, head)
    with _threads(threads), torch.inference_mode(), gemm_mode(path):
        w_all = gemm_operand(head, head.device, path)  # same fp32-logits GEMM as the scorer
        for r0 in range(0, n, tile):
            a = ref_hidden[r0 : r0 + tile]
            b = cand_hidden[r0 : r0 + tile]
            m = a.shape[0]
            dv = w_all.device  # (device-aware so the benchmark can run it on CUDA too)
            buf_a = torch.empty(m, min(vocab_chunk, vocab), device=dv)
            buf_b = torch.empty(m, min(vocab_chunk, vocab), device=dv)
            lse_a = torch.full((m,), -math.inf, device=dv)
            lse_b = torch.full((m,), -math.inf, device=dv)
            for v0 in range(0, vocab, vocab_chunk):
                w = w_all[v0 : v0 + vocab_chunk]
                k = w.shape[0]
                lse_a = torch.logaddexp(lse_a, torch.logsumexp(logits_gemm(a, w, buf_a[:, :k]), 1))
                lse_b = torch.logaddexp(lse_b, torch.logsumexp(logits_gemm(b, w, buf_b[:, :k]), 1))
            acc = torch.zeros(m, dtype=torch.float64, device=dv)
            for v0 in range(0, vocab, vocab_chunk):
                w = w_all[v0 : v0 + vocab_chunk]
                k = w.shape[0]
                lp = logits_gemm(a, w, buf_a[:, :k]).sub_(lse_a[:, None])
                lq = logits_gemm(b, w, buf_b[:, :k]).sub_(lse_b[:, None])
                acc += (lp.exp() * (lp - lq)).sum(1).double()
            kld[r0 : r0 + a.shape[0]] = acc.cpu().numpy()
    return kld


def bare_gemms(
    ref_hidden: torch.Tensor,
    cand_hidden: torch.Tensor,
    head: torch.Tensor,
    *,
    tile_rows: int | None = None,
    threads: int | None = None,
    fp32_logits: bool = True,
    gemm: str | None = None,
) -> float:
    """Seconds for the two bare GEMMs (reference and candidate logits), tiled like the scorer: the floor.

    ``fp32_logits=True`` times the GEMM the scorer needs (fp32 logits, :func:`logits_gemm`, on the
    path :func:`gemm_path` picks, or on ``gemm`` when given, e.g. ``"fp32"`` for plain fp32 GEMMs);
    ``False`` times the head-dtype GEMM (bf16 logits), the device's fastest but inexact product.
    """
    n = ref_hidden.shape[0]
    vocab = head.shape[0]
    dev = head.device
    tile = balanced_tile_rows(n, int(tile_rows or default_tile_rows(vocab, 4)), exact=tile_rows is not None)
    path = (gemm or gemm_path(dev, ref_hidden, cand_hidden, head)) if fp32_logits else "fp32"
    with _threads(threads), torch.inference_mode(), gemm_mode(path):
        if fp32_logits:  # exactly the scorer's GEMMs and tiling (logits_tiles)
            _sync(dev)
            t0 = time.perf_counter()
            for _ in logits_tiles(ref_hidden, cand_hidden, head, None, tile, dev, path):
                pass
            _sync(dev)
            return time.perf_counter() - t0
        buf_a = torch.empty(tile, vocab, dtype=head.dtype, device=dev)
        buf_b = torch.empty(tile, vocab, dtype=head.dtype, device=dev)
        t0 = time.perf_counter()
        for r0 in range(0, n, tile):
            m = min(n, r0 + tile) - r0
            torch.mm(ref_hidden[r0 : r0 + m].to(dev, head.dtype), head.t(), out=buf_a[:m])
            torch.mm(cand_hidden[r0 : r0 + m].to(dev, head.dtype), head.t(), out=buf_b[:m])
        _sync(dev)
        return time.perf_counter() - t0


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
