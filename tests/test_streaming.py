"""harness/scoring/streaming.py: the prefetching reader (order, errors, bounded memory, early close) and
streamed shard scoring equal to the whole-shard scorer."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import harness.scoring.groups as groups
from harness.capture.store import CaptureStore, StoreWriter
from harness.engines.identity import runtime_identity
from harness.inputs.suite import Suite
from harness.scoring.scorer import score_hidden
from harness.scoring.streaming import Prefetcher, chunk_indices, score_hidden_streaming


def test_prefetcher_yields_in_order_and_stays_bounded() -> None:
    live = 0
    peak = 0
    lock = threading.Lock()

    def load(i: int) -> int:
        nonlocal live, peak
        with lock:
            live += 1
            peak = max(peak, live)
        return i * i

    got = []
    with Prefetcher(load, range(20), depth=2) as pf:
        for i, v in pf:
            time.sleep(0.002)  # a slow consumer: the loader runs ahead until the queue is full
            got.append((i, v))
            with lock:
                live -= 1
    assert got == [(i, i * i) for i in range(20)]
    assert peak <= 2 + 2  # queued (depth) + the one being put + the one being consumed


def test_prefetcher_reraises_in_the_consumer() -> None:
    def load(i: int) -> int:
        if i == 3:
            raise OSError("disk on fire")
        return i

    seen = []
    with pytest.raises(OSError, match="disk on fire"):
        for i, _v in Prefetcher(load, range(10)):
            seen.append(i)
    assert seen == [0, 1, 2]


def test_prefetcher_stops_on_early_exit() -> None:
    pf = Prefetcher(lambda i: i, range(1000), depth=1)
    for i, _ in pf:
        if i == 2:
            break
    pf.close()
    assert not pf._thread.is_alive()


def test_chunk_indices() -> None:
    assert chunk_indices(list(range(10)), 4, 100, 1000) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert chunk_indices([5, 6], 1000, 1000, 1) == [[5], [6]]  # at least one context per chunk


HIDDEN, VOCAB = 32, 300


class _FakeStore:
    def __init__(self, rows: torch.Tensor, n_ctx_rows: int) -> None:
        self.rows, self.shape, self.width = rows, (n_ctx_rows, rows.shape[1]), rows.shape[1]

    def load_rows(self, idx: list[int]) -> torch.Tensor:
        r = self.shape[0]
        return torch.cat([self.rows[i * r : (i + 1) * r] for i in idx])


def test_streamed_scores_equal_whole_shard(same_scores: Any) -> None:
    g = torch.Generator().manual_seed(0)
    rows, n_ctx = 15, 9
    ref = torch.randn(rows * n_ctx, HIDDEN, generator=g).bfloat16()
    cand = (ref.float() + 0.1 * torch.randn(ref.shape, generator=g)).bfloat16()
    head = torch.randn(VOCAB, HIDDEN, generator=g).bfloat16()
    y = torch.randint(0, VOCAB, (rows * n_ctx,), generator=g)
    whole = score_hidden(ref, cand, head, y)
    s, wait_s, score_s = score_hidden_streaming(_FakeStore(ref, rows), _FakeStore(cand, rows), list(range(n_ctx)), y, head,
                                                chunk_bytes=2 * rows * HIDDEN * 2)  # 2 contexts per chunk
    assert wait_s >= 0 and score_s > 0
    same_scores(s, whole, ref, cand, head)


def test_shard_positions_streams_large_shards(tiny_suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             same_scores: Any) -> None:
    from harness.run.shard import shard_positions
    from harness.run.shard_inputs import ShardInputs

    suite = Suite.load(tiny_suite)
    stores = []
    for name, noise in (("ref", 0.0), ("cand", 0.1)):
        path = tmp_path / name
        with StoreWriter(path, suite, "hidden_states", HIDDEN, "bfloat16", {"name": name, "config_sha256": "0" * 64, "weights": {}},
                         {"name": "test", "version": "0"}, runtime_identity(), "cpu") as w:
            for i in range(suite.n_contexts):
                x = torch.randn(suite.n_ctx - 1, HIDDEN, generator=torch.Generator().manual_seed(i))
                w.write(i, (x + noise * torch.randn(x.shape, generator=torch.Generator().manual_seed(1000 + i))).bfloat16())
        stores.append(CaptureStore.open(path, suite))
    vocab = max(suite.vocab_size, 1)
    head = SimpleNamespace(weight=torch.randn(vocab, HIDDEN, generator=torch.Generator().manual_seed(7)).bfloat16(), sha256="h")
    inputs = ShardInputs(suite=suite, shard=0, reference=stores[0], candidate=stores[1], head=head)
    plain = shard_positions(inputs)
    monkeypatch.setattr(groups, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(groups, "CHUNK_BYTES", 1)  # one context per chunk
    streamed = shard_positions(inputs)
    rows = {side: {c: stores[k].load(c) for c in set(plain.context_index.tolist())} for k, side in enumerate("rc")}
    at = list(zip(plain.context_index.tolist(), plain.row.tolist()))
    ref_rows, cand_rows = (torch.stack([rows[side][c][r] for c, r in at]) for side in "rc")
    same_scores(streamed.scores, plain.scores, ref_rows, cand_rows, head.weight)
    np.testing.assert_array_equal(streamed.context_index, plain.context_index)
    np.testing.assert_array_equal(streamed.row, plain.row)
