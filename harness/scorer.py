"""Exact full-vocabulary scorer (DESIGN.md sections 2 and 6).

Per position, with p = softmax(reference logits) and q = softmax(candidate logits) over the
*whole* vocabulary (never top-k), the scorer returns KL(p||q) in nats, the Jensen-Shannon
divergence in bits, EAR = sum min(p, q), the negative log-likelihoods of the true next token
under both, and both argmaxes (ties to the lowest token id).

How it is computed
------------------
* **One GEMM per hidden state.** Rows are processed in tiles of ``tile_rows``: the reference
  and candidate logits of a tile are computed once each (``tile @ head.T`` in the head's
  dtype; torch accumulates bf16 products in fp32) and every metric is derived from those two
  tiles while they are in memory. The GEMM result is in the head's dtype (bf16 logits for a
  bf16 head, exactly what the model's own LM head produces); pass an fp32 head for fp32
  logits.
* **Cache-sized metric chunks.** The metric math runs over ``chunk_rows`` rows of a tile at a
  time in six pre-allocated fp32 buffers, so on a CPU the ~30 elementwise passes stay in cache.
  With T torch threads, T worker threads each take whole chunks with single-threaded ops (see
  ``_MetricRunner``). Peak extra memory is ``2 * tile_rows * vocab`` logits plus
  ``T * 6 * chunk_rows * vocab`` fp32 values, independent of the number of positions N
  (``tile_rows`` defaults to what fits :data:`MEMORY_BUDGET_BYTES`); outputs are numpy arrays
  of length N.
* **Numerics.** Softmax in fp32, max-shifted; row sums accumulate in float64
  (``sum(dtype=float64)``) and their logarithms are taken in float64.
  d = ln p - ln q is formed as ``(x - max x) - (y - max y) - (ln s_x - ln s_y)``: the two
  normalizers cancel in float64 first, so d keeps full fp32 relative accuracy even for tiny
  divergences (an fp32 log_softmax would leave an ulp(lse) ~ 1e-6 offset in d, and therefore
  in KLD). Identical
  inputs give d == 0 and KLD == 0 exactly, by construction, without any clamping.
  JSD uses a cancellation-free form: with a = |d|, s = tanh(a/2) = -expm1(-a) / (2 + expm1(-a)),

      2 * JSD_nats = sum (p + q) * log1p(s) - sum min(p, q) * a

  (ln(2 max / (p+q)) = log1p(s) and ln(2 min / (p+q)) = log1p(s) - a), which is exact for
  any finite d and never forms log(0).
  EAR = sum min(p, q) (identical inputs give exactly 1), clipped to [0, 1] against rounding.
* Inputs must be finite (captures and heads are verified upstream, DESIGN.md section 4).

The module is device-agnostic: the same code runs on CUDA (there ``chunk_rows`` defaults to
the whole tile).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

__all__ = [
    "PositionScores",
    "score_hidden",
    "score_logits",
    "score_two_pass",
    "bare_gemms",
    "default_tile_rows",
    "scorer_settings",
    "MEMORY_BUDGET_BYTES",
]

#: Memory budget for the two logits tiles of one GEMM tile (the dominant buffers).
MEMORY_BUDGET_BYTES = 256 * 1024 * 1024
#: Budget for the six fp32 metric buffers on a CPU (about an L2/L3 slice).
CPU_CHUNK_BYTES = 6 * 1024 * 1024
_LN2 = math.log(2.0)


@dataclass
class PositionScores:
    """Per-position scores; every field is a numpy array of length N (one entry per position)."""

    kld: np.ndarray  # float64, nats, KL(p||q)
    jsd_bits: np.ndarray  # float64
    ear: np.ndarray  # float64, sum min(p, q)
    nll_ref: np.ndarray  # float64, -ln p(y)
    nll_cand: np.ndarray  # float64, -ln q(y)
    argmax_ref: np.ndarray  # int64, ties to the lowest token id
    argmax_cand: np.ndarray  # int64

    @property
    def top1(self) -> np.ndarray:
        """Boolean array: the two argmaxes agree."""
        return self.argmax_ref == self.argmax_cand

    def __len__(self) -> int:
        return int(self.kld.shape[0])

    @classmethod
    def empty(cls, n: int) -> "PositionScores":
        f = lambda: np.zeros(n, dtype=np.float64)  # noqa: E731
        i = lambda: np.zeros(n, dtype=np.int64)  # noqa: E731
        return cls(f(), f(), f(), f(), f(), i(), i())

    @classmethod
    def concat(cls, parts: Sequence["PositionScores"]) -> "PositionScores":
        """Concatenate in order (e.g. the contexts of a shard)."""
        if not parts:
            return cls.empty(0)
        return cls(**{fl.name: np.concatenate([getattr(p, fl.name) for p in parts]) for fl in fields(cls)})

    def select(self, mask: np.ndarray) -> "PositionScores":
        """Subset by boolean mask or integer index array."""
        return PositionScores(**{fl.name: getattr(self, fl.name)[mask] for fl in fields(self)})

    def to_dict(self) -> dict[str, np.ndarray]:
        return {fl.name: getattr(self, fl.name) for fl in fields(self)}


def default_tile_rows(vocab: int, logits_itemsize: int = 2, budget: int = MEMORY_BUDGET_BYTES) -> int:
    """Rows per GEMM tile so that the two logits tiles fit in ``budget`` bytes (16..1024, multiple of 16)."""
    rows = budget // max(1, 2 * vocab * logits_itemsize)
    rows = max(16, min(1024, rows))
    return int(rows // 16 * 16)


def _default_chunk_rows(vocab: int, device: torch.device, tile_rows: int) -> int:
    if device.type != "cpu":
        return tile_rows
    return int(max(1, min(tile_rows, CPU_CHUNK_BYTES // (6 * 4 * vocab))))


def scorer_settings(tile_rows: int, chunk_rows: int, head_dtype: torch.dtype) -> dict[str, Any]:
    """Scorer settings recorded in a report's comparability block (results do not depend on tiling)."""
    return {
        "method": "single-pass-tiled",
        "gemm_dtype": str(head_dtype).replace("torch.", ""),
        "softmax_dtype": "float32",
        "tile_rows": int(tile_rows),
        "chunk_rows": int(chunk_rows),
    }


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


def _metrics_chunk(
    ref: torch.Tensor,
    cand: torch.Tensor,
    targets: torch.Tensor,
    ws: _Workspace,
    out: PositionScores,
    start: int,
) -> None:
    """All metrics for one chunk of rows of logits (any float dtype), written to ``out[start:]``.

    Notation: x, y = reference and candidate logits; X = x - max x, Y = y - max y (fp32, exact
    for bf16/fp16 logits); P = exp(X), Q = exp(Y) (unnormalized); s_a, s_b their row sums
    (float64). Then d = ln p - ln q = (X - Y) - (ln s_a - ln s_b): the normalizers cancel in
    float64 before anything is rounded to fp32, so d is accurate even when the divergence is tiny.
    """
    rows = ref.shape[0]
    X, Y, P, Q, A, B = ws.view(rows)
    mx_a, am_a = torch.max(ref, dim=1)  # first maximal index: ties go to the lowest token id
    mx_b, am_b = torch.max(cand, dim=1)
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
    X.sub_(Y).sub_((ln_a - ln_b).float()[:, None])  # X := d = ln p - ln q (exactly 0 where inputs agree)
    Q.mul_((s_a / s_b).float()[:, None])  # Q := q * s_a, on the same scale as P = p * s_a
    kld = torch.mul(P, X, out=Y).sum(1, dtype=torch.float64)
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

    sl = slice(start, start + rows)
    stats = torch.stack([kld, s_a, s_min, j_min, j_sum, nll_a, nll_b]).cpu().numpy()
    kld_n, sa_n, smin_n, jmin_n, jsum_n, nlla_n, nllb_n = stats
    out.kld[sl] = kld_n / sa_n
    out.jsd_bits[sl] = 0.5 * (jsum_n - jmin_n) / sa_n / _LN2
    out.ear[sl] = np.clip(smin_n / sa_n, 0.0, 1.0)
    out.nll_ref[sl] = nlla_n
    out.nll_cand[sl] = nllb_n
    out.argmax_ref[sl] = am_a.cpu().numpy()
    out.argmax_cand[sl] = am_b.cpu().numpy()


class _MetricRunner:
    """Runs :func:`_metrics_chunk` over the chunks of a logits tile.

    On a CPU with T > 1 torch threads, T Python worker threads each run whole chunks with
    single-threaded torch ops (torch releases the GIL), instead of splitting every small
    elementwise op across T OpenMP threads: ~20 synchronizations per chunk otherwise, which
    cost a scheduler time slice each when the cores are shared. The GEMMs keep all T threads.
    """

    def __init__(self, chunk_rows: int, vocab: int, device: torch.device) -> None:
        self.chunk = chunk_rows
        threads = torch.get_num_threads() if device.type == "cpu" else 1
        self.workers = max(1, threads)
        self.spaces = [_Workspace(chunk_rows, vocab, device) for _ in range(self.workers)]
        self.pool: Any = None
        if self.workers > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(self.workers, initializer=torch.set_num_threads, initargs=(1,))

    def __enter__(self) -> "_MetricRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def _work(self, k: int, la: torch.Tensor, lb: torch.Tensor, t: torch.Tensor, out: PositionScores, start: int) -> None:
        with torch.inference_mode():
            ws = self.spaces[k]
            m = la.shape[0]
            for c0 in range(k * self.chunk, m, self.chunk * self.workers):
                c1 = min(m, c0 + self.chunk)
                _metrics_chunk(la[c0:c1], lb[c0:c1], t[c0:c1], ws, out, start + c0)

    def run(self, la: torch.Tensor, lb: torch.Tensor, t: torch.Tensor, out: PositionScores, start: int) -> None:
        if self.pool is None:
            self._work(0, la, lb, t, out, start)
            return
        futs = [self.pool.submit(self._work, k, la, lb, t, out, start) for k in range(self.workers)]
        for f in futs:
            f.result()


def _check_targets(targets: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    if targets.ndim != 1 or targets.shape[0] != n:
        raise ValueError(f"targets: expected shape [{n}], found {list(targets.shape)}")
    t = targets.to(torch.int64)
    if n and (int(t.min()) < 0 or int(t.max()) >= vocab):
        raise ValueError(f"targets: expected token ids in [0, {vocab}), found range [{int(t.min())}, {int(t.max())}]")
    return t


def _resolve_device(device: str | torch.device | None, like: torch.Tensor) -> torch.device:
    return torch.device(device) if device is not None else like.device


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
) -> PositionScores:
    """Score hidden states ``[N, H]`` through the LM head ``[V, H]`` (candidate through ``cand_head`` if given).

    Each hidden state is multiplied by the head exactly once; see the module docstring.
    """
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
    out = PositionScores.empty(n)
    if n == 0:
        return out
    with _threads(threads), torch.inference_mode():
        w = head.to(dev)
        w_c = cand_head.to(dev) if cand_head is not None else w
        tile = int(tile_rows or default_tile_rows(vocab, w.element_size()))
        chunk = int(chunk_rows or _default_chunk_rows(vocab, dev, tile))
        tile = min(tile, n)
        chunk = min(chunk, tile)
        buf_a = torch.empty(tile, vocab, dtype=w.dtype, device=dev)
        buf_b = torch.empty(tile, vocab, dtype=w_c.dtype, device=dev)
        t_dev = t_all.to(dev)
        with _MetricRunner(chunk, vocab, dev) as runner:
            for r0 in range(0, n, tile):
                r1 = min(n, r0 + tile)
                m = r1 - r0
                a = ref_hidden[r0:r1].to(dev, w.dtype)
                b = cand_hidden[r0:r1].to(dev, w_c.dtype)
                la = torch.mm(a, w.t(), out=buf_a[:m])
                lb = torch.mm(b, w_c.t(), out=buf_b[:m])
                runner.run(la, lb, t_dev[r0:r1], out, r0)
    return out


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
        chunk = int(tile_rows or _default_chunk_rows(vocab, dev, 1024))
        chunk = min(chunk, n)
        t_dev = t_all.to(dev)
        with _MetricRunner(chunk, vocab, dev) as runner:
            for r0 in range(0, n, chunk * runner.workers):
                r1 = min(n, r0 + chunk * runner.workers)
                runner.run(ref_logits[r0:r1].to(dev), cand_logits[r0:r1].to(dev), t_dev[r0:r1], out, r0)
    return out


# --------------------------------------------------------------------------------------------
# Reference methods for the benchmark only (DESIGN.md section 6).


def score_two_pass(
    ref_hidden: torch.Tensor,
    cand_hidden: torch.Tensor,
    head: torch.Tensor,
    targets: torch.Tensor,
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
    tile = int(tile_rows or default_tile_rows(vocab, head.element_size()))
    kld = np.zeros(n, dtype=np.float64)
    with _threads(threads), torch.inference_mode():
        for r0 in range(0, n, tile):
            a = ref_hidden[r0 : r0 + tile].to(head.dtype)
            b = cand_hidden[r0 : r0 + tile].to(head.dtype)
            lse_a = torch.full((a.shape[0],), -math.inf)
            lse_b = torch.full((a.shape[0],), -math.inf)
            for v0 in range(0, vocab, vocab_chunk):
                w = head[v0 : v0 + vocab_chunk]
                lse_a = torch.logaddexp(lse_a, torch.logsumexp((a @ w.t()).float(), 1))
                lse_b = torch.logaddexp(lse_b, torch.logsumexp((b @ w.t()).float(), 1))
            acc = torch.zeros(a.shape[0], dtype=torch.float64)
            for v0 in range(0, vocab, vocab_chunk):
                w = head[v0 : v0 + vocab_chunk]
                lp = (a @ w.t()).float().sub_(lse_a[:, None])
                lq = (b @ w.t()).float().sub_(lse_b[:, None])
                acc += (lp.exp() * (lp - lq)).sum(1).double()
            kld[r0 : r0 + a.shape[0]] = acc.numpy()
    _ = targets
    return kld


def bare_gemms(
    ref_hidden: torch.Tensor,
    cand_hidden: torch.Tensor,
    head: torch.Tensor,
    *,
    tile_rows: int | None = None,
    threads: int | None = None,
) -> float:
    """Seconds for the two bare GEMMs (reference and candidate logits), tiled like the scorer: the floor."""
    n = ref_hidden.shape[0]
    vocab = head.shape[0]
    tile = min(n, int(tile_rows or default_tile_rows(vocab, head.element_size())))
    with _threads(threads), torch.inference_mode():
        buf_a = torch.empty(tile, vocab, dtype=head.dtype)
        buf_b = torch.empty(tile, vocab, dtype=head.dtype)
        t0 = time.perf_counter()
        for r0 in range(0, n, tile):
            a = ref_hidden[r0 : r0 + tile].to(head.dtype)
            b = cand_hidden[r0 : r0 + tile].to(head.dtype)
            m = a.shape[0]
            torch.mm(a, head.t(), out=buf_a[:m])
            torch.mm(b, head.t(), out=buf_b[:m])
        return time.perf_counter() - t0
