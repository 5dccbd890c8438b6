"""Streaming capture reads: load the next contexts while the current ones are scored.

A shard of a Qwen-class capture is large (a 512-context shard at hidden 5120 is ~2.7 GB per
store in bf16), and loading it whole before scoring serializes disk I/O and compute and holds
the whole shard in memory. :class:`Prefetcher` runs the loads on one background thread into a
bounded queue (``depth`` chunks), so at most ``depth + 2`` chunks (queued, being loaded, being
scored) are resident at once and the I/O of chunk k+1 overlaps the scoring of chunk k. Store
reads go through safetensors (``safe_open`` memory-maps the file; each context is copied once
into its rows of the chunk, see :meth:`harness.capture.store.CaptureStore.load_rows`).

Reasoning: docs/performance.md §"Streaming reads".
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from harness.scoring import groups
from harness.scoring.groups import CHUNK_BYTES, STREAM_MIN_BYTES, chunk_indices, score_groups, streams

if TYPE_CHECKING:
    import torch

    from harness.metrics.scores import PositionScores

#: The size rules live in :mod:`harness.scoring.groups` (re-exported here; change them there).
__all__ = ["Prefetcher", "RowSource", "chunk_indices", "score_groups", "streams", "score_hidden_streaming", "STREAM_MIN_BYTES", "CHUNK_BYTES"]

#: An item the prefetcher loads (a chunk of context indices) and the value it loads for it.
Item = TypeVar("Item")
Value = TypeVar("Value")


class RowSource(Protocol):
    """What the streaming scorer reads of a capture: its ``(rows per context, width)`` shape and the rows
    of some contexts as one ``[len(indices) * rows, width]`` tensor, in context order
    (:class:`harness.capture.store.CaptureStore` is one)."""

    @property
    def shape(self) -> tuple[int, int]: ...

    def load_rows(self, indices: Sequence[int]) -> torch.Tensor: ...


class Prefetcher(Generic[Item, Value]):
    """Iterate ``load(item)`` for ``items`` in order, computed ``depth`` items ahead on a thread.

    Yields ``(item, value)``. An exception in ``load`` is re-raised in the consumer at that
    item. ``wait_s`` accumulates the time the consumer spent blocked waiting for a value (the
    part of loading not hidden behind the consumer's work). Use as a context manager (or exhaust
    it) so the thread is stopped and joined.
    """

    def __init__(self, load: Callable[[Item], Value], items: Sequence[Item], depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"depth: expected >= 1, found {depth}")
        self._load = load
        self._items = list(items)
        #: ``(item, value)``, the error ``load`` raised, or ``None`` after the last item
        self._q: queue.Queue[tuple[Item, Value] | BaseException | None] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.wait_s = 0.0
        self.load_s = 0.0
        self._thread = threading.Thread(target=self._run, name="fidelity-prefetch", daemon=True)
        self._thread.start()

    def _put(self, obj: tuple[Item, Value] | BaseException | None) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(obj, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for it in self._items:
                if self._stop.is_set():
                    return
                t0 = time.perf_counter()
                value = self._load(it)
                self.load_s += time.perf_counter() - t0
                if not self._put((it, value)):
                    return
        except BaseException as e:  # noqa: BLE001  (re-raised in the consumer)
            self._put(e)
            return
        self._put(None)

    def __iter__(self) -> Iterator[tuple[Item, Value]]:
        try:
            while True:
                t0 = time.perf_counter()
                got = self._q.get()
                self.wait_s += time.perf_counter() - t0
                if got is None:
                    return
                if isinstance(got, BaseException):
                    raise got
                yield got
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> Prefetcher[Item, Value]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def score_hidden_streaming(
    reference: RowSource,
    candidate: RowSource,
    indices: Sequence[int],
    targets: torch.Tensor,
    head: torch.Tensor,
    cand_head: torch.Tensor | None = None,
    *,
    device: str = "cpu",
    chunk_bytes: int | None = None,
    depth: int = 2,
    tile_rows: int | None = None,
    chunk_rows: int | None = None,
    threads: int | None = None,
    backend: str | None = None,
) -> tuple[PositionScores, float, float]:
    """Score contexts ``indices`` of two hidden-state stores chunk by chunk with prefetching.

    ``targets`` is the ``[len(indices) * rows]`` tensor of next-token ids (rows in context
    order). Returns ``(PositionScores, load_wait_s, score_s)``: ``load_wait_s`` is the loading
    time *not* hidden behind scoring.
    """
    import torch

    from harness.scoring.scorer import PositionScores, score_hidden

    rows = reference.shape[0]
    width = reference.shape[1]
    itemsize = torch.empty(0, dtype=head.dtype).element_size()
    chunks = chunk_indices(indices, rows, width * itemsize, chunk_bytes or groups.CHUNK_BYTES)
    out = PositionScores.empty(len(indices) * rows)
    score_s = 0.0
    pos = 0

    def load(chunk: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return reference.load_rows(chunk), candidate.load_rows(chunk)

    pf = Prefetcher(load, chunks, depth)
    with pf:
        for chunk, (ref, cnd) in pf:
            t0 = time.perf_counter()
            n = len(chunk) * rows
            s = score_hidden(ref, cnd, head, targets[pos : pos + n], cand_head=cand_head, device=device,
                             tile_rows=tile_rows, chunk_rows=chunk_rows, threads=threads, backend=backend)
            for name, arr in s.to_dict().items():
                getattr(out, name)[pos : pos + n] = arr
            pos += n
            score_s += time.perf_counter() - t0
    assert pos == out.kld.shape[0], (pos, out.kld.shape)
    return out, pf.wait_s, score_s
