"""llama.cpp's ``.kld`` file: the base model's quantized log-probs (``llama-perplexity --kl-divergence-base``).

Reasoning: docs/llamacpp.md §"The format".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import FidelityError, VerificationError
from harness.io.atomic import atomic_writer
from harness.llamacpp.kld_parts import ChunkRows, PartedFile, is_parts_manifest, open_parts

MAGIC = b"_logits_"
HEADER_BYTES = 8 + 3 * 4
#: llama.cpp clamps the minimum logit at ``max - LOGIT_RANGE`` and sums KLD over log-probs > -LOGIT_RANGE.
LOGIT_RANGE = 16.0
_ROUND_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23


def row_width(n_vocab: int) -> int:
    """uint16 entries per stored row: ``2 * ceil(n_vocab / 2) + 4`` (two float32 + the quantized log-probs)."""
    return 2 * ((n_vocab + 1) // 2) + 4


def first_scored(n_ctx: int) -> int:
    """First scored position of a chunk: ``n_ctx // 2`` (llama.cpp scores the second half)."""
    return n_ctx // 2


def rows_per_chunk(n_ctx: int) -> int:
    """Scored rows per chunk: positions ``n_ctx//2 .. n_ctx-2``."""
    return n_ctx - 1 - n_ctx // 2


def file_size(n_ctx: int, n_vocab: int, n_chunk: int) -> int:
    """Exact size in bytes of a ``.kld`` file with this geometry."""
    return HEADER_BYTES + 4 * n_chunk * n_ctx + 2 * n_chunk * rows_per_chunk(n_ctx) * row_width(n_vocab)


def expf(x: np.ndarray) -> np.ndarray:
    """float32 ``expf``: correctly rounded (float64 exp, rounded once to float32)."""
    return np.exp(x.astype(np.float64)).astype(np.float32)


def nearest_int(v: np.ndarray) -> np.ndarray:
    """llama.cpp ``nearest_int``: float32 ``v + 1.5*2^23``, then the low mantissa bits (round half to even)."""
    s = (np.asarray(v, dtype=np.float32) + _ROUND_MAGIC).astype(np.float32)
    return (s.view(np.int32) & 0x007FFFFF) - 0x00400000


def quantize_rows(logits: np.ndarray) -> np.ndarray:
    """Rows of logits ``[R, n_vocab]`` (float32) -> stored rows ``[R, row_width(n_vocab)]`` uint16,
    exactly as llama.cpp's ``log_softmax(n_vocab, logits, log_prob, tok)`` fills them."""
    x = np.ascontiguousarray(logits, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"logits: expected [rows, n_vocab], found shape {list(x.shape)}")
    r, v = x.shape
    out = np.zeros((r, row_width(v)), dtype=np.uint16)
    if r == 0:
        return out
    mx = x.max(axis=1)
    mn = np.maximum(x.min(axis=1), (mx - np.float32(LOGIT_RANGE)).astype(np.float32))
    sum_exp = expf(x - mx[:, None]).astype(np.float64).sum(axis=1)
    lse = np.log(sum_exp).astype(np.float32)
    min_log_prob = ((mn - mx).astype(np.float32) - lse).astype(np.float32)
    scale = ((mx - mn).astype(np.float32) / np.float32(65535.0)).astype(np.float32)
    head = out[:, :4].view(np.float32)  # two float32 per row
    head[:, 0] = scale
    head[:, 1] = min_log_prob
    nz = scale != 0
    if nz.any():
        inv = (np.float32(1.0) / scale[nz]).astype(np.float32)
        xs, m = x[nz], mn[nz]
        diff = (xs - m[:, None]).astype(np.float32)
        q = nearest_int((inv[:, None] * diff).astype(np.float32))
        q = np.where(xs > m[:, None], q, 0)
        out[nz, 4 : 4 + v] = (q & 0xFFFF).astype(np.uint16)  # C's int -> uint16 conversion is modulo 2^16
    return out


def decode_rows(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """Stored rows ``[R, nv]`` uint16 -> llama.cpp's decoded base log-probs ``[R, n_vocab]`` float32
    (``scale * q + min_log_prob`` in float32)."""
    rows = np.ascontiguousarray(rows, dtype=np.uint16)
    head = rows[:, :4].view(np.float32)
    scale, mlp = head[:, 0], head[:, 1]
    q = rows[:, 4 : 4 + n_vocab].astype(np.float32)
    return ((scale[:, None] * q).astype(np.float32) + mlp[:, None]).astype(np.float32)


@dataclass
class KldFile:
    """An opened ``.kld`` file (fully size-checked; rows memory-mapped)."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray  # int32 [n_chunk, n_ctx]
    rows: Any  # uint16 [n_chunk, rows_per_chunk, nv]: a memmap, or ChunkRows over a file's parts

    @property
    def first(self) -> int:
        return first_scored(self.n_ctx)

    @property
    def n_rows(self) -> int:
        return rows_per_chunk(self.n_ctx)

    def log_probs(self, chunk: int) -> np.ndarray:
        """Decoded base log-probs of one chunk, ``[n_rows, n_vocab]`` float32 (row j = position first + j)."""
        return decode_rows(np.asarray(self.rows[chunk]), self.n_vocab)

    def targets(self, chunk: int) -> np.ndarray:
        """The tokens the scored rows of ``chunk`` predict (positions first+1 .. n_ctx-1)."""
        return self.tokens[chunk, self.first + 1 :].astype(np.int64)


def read_kld(path: str | Path) -> KldFile:
    """Open and structurally verify a ``.kld`` file: magic, positive geometry, exact size (no
    truncation, no trailing bytes), token ids in ``[0, n_vocab)``. Raises ``VerificationError``.

    A ``*.kld.parts.json`` manifest opens the file its parts make up, in order, without joining them
    (:mod:`harness.llamacpp.kld_parts`)."""
    p = Path(path)
    pf: PartedFile | None = None
    try:
        if is_parts_manifest(p):
            pf = open_parts(p)
            size, head = pf.size, pf.read(0, min(HEADER_BYTES, pf.size))
        else:
            size = p.stat().st_size
            with open(p, "rb") as fh:
                head = fh.read(HEADER_BYTES)
    except OSError as e:
        raise VerificationError(p, f"cannot read .kld file ({e.strerror})") from None
    if head[:8] == MAGIC and len(head) < HEADER_BYTES:
        raise VerificationError(p, "header", f"{HEADER_BYTES} bytes", f"{len(head)} bytes", "truncated (llama-perplexity stops "
                                "after the header when the text is too short for two contexts)")
    if len(head) < HEADER_BYTES or head[:8] != MAGIC:
        raise VerificationError(p, "magic", MAGIC.decode(), head[:8], "not a llama.cpp --kl-divergence-base file")
    n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(head, dtype="<i4", count=3, offset=8))
    if n_ctx < 4 or n_vocab < 1 or n_chunk < 1:
        raise VerificationError(p, "header (n_ctx >= 4, n_vocab >= 1, n_chunk >= 1)", "positive geometry", (n_ctx, n_vocab, n_chunk))
    want = file_size(n_ctx, n_vocab, n_chunk)
    if size != want:
        raise VerificationError(p, f"file size for n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}", want, size,
                                "truncated" if size < want else "trailing bytes")
    if pf is not None:
        tokens = np.frombuffer(pf.read(HEADER_BYTES, 4 * n_chunk * n_ctx), dtype="<i4").reshape(n_chunk, n_ctx)
    else:
        tokens = np.fromfile(p, dtype="<i4", count=n_chunk * n_ctx, offset=HEADER_BYTES).reshape(n_chunk, n_ctx)
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= n_vocab):
        raise VerificationError(p, "token ids", f"in [0, {n_vocab})", f"[{int(tokens.min())}, {int(tokens.max())}]")
    shape = (n_chunk, rows_per_chunk(n_ctx), row_width(n_vocab))
    if pf is not None:
        return KldFile(p, n_ctx, n_vocab, n_chunk, tokens, ChunkRows(pf, HEADER_BYTES + 4 * n_chunk * n_ctx, shape))
    rows = np.memmap(p, dtype="<u2", mode="r", offset=HEADER_BYTES + 4 * n_chunk * n_ctx, shape=shape)
    return KldFile(p, n_ctx, n_vocab, n_chunk, tokens, rows)


def write_kld(
    path: str | Path,
    tokens: np.ndarray,
    n_vocab: int,
    chunk_logits: Callable[[int], np.ndarray] | Iterable[np.ndarray],
) -> Path:
    """Write a ``.kld`` file for ``tokens`` ``[n_chunk, n_ctx]``.

    ``chunk_logits(i)`` (or the i-th item of an iterable) gives chunk i's logits for either all
    rows ``0 .. n_ctx-2`` (``[n_ctx-1, n_vocab]``, the capture-store layout) or only the scored
    rows ``n_ctx/2 .. n_ctx-2``. Written to a temporary name and renamed.
    """
    toks = np.asarray(tokens)
    if toks.ndim != 2:
        raise FidelityError(f"tokens: expected [n_chunk, n_ctx], found shape {list(toks.shape)}")
    n_chunk, n_ctx = toks.shape
    if n_ctx < 4 or n_chunk < 1:
        raise FidelityError(f"tokens: need n_ctx >= 4 and at least one chunk, found {list(toks.shape)}")
    if int(toks.min()) < 0 or int(toks.max()) >= n_vocab:
        raise FidelityError(f"tokens: ids must lie in [0, {n_vocab}), found [{int(toks.min())}, {int(toks.max())}]")
    first, nr = first_scored(n_ctx), rows_per_chunk(n_ctx)
    get_next = (lambda: np.empty(0)) if callable(chunk_logits) else iter(chunk_logits).__next__
    out = Path(path)
    with atomic_writer(out) as fh:
        fh.write(MAGIC)
        fh.write(np.array([n_ctx, n_vocab, n_chunk], dtype="<i4").tobytes())
        fh.write(np.ascontiguousarray(toks, dtype="<i4").tobytes())
        for i in range(n_chunk):
            lg = np.asarray(chunk_logits(i) if callable(chunk_logits) else get_next(), dtype=np.float32)
            if lg.shape == (n_ctx - 1, n_vocab):
                lg = lg[first:]
            if lg.shape != (nr, n_vocab):
                raise FidelityError(f"chunk {i}: expected logits [{n_ctx - 1} or {nr}, {n_vocab}], found {list(lg.shape)}")
            if not np.isfinite(lg).all():
                raise FidelityError(f"chunk {i}: logits contain NaN/Inf")
            fh.write(quantize_rows(lg).astype("<u2").tobytes())
    return out
