#!/usr/bin/env python
"""End-to-end shard scoring rate (store reads + scoring) versus the scorer alone.

Writes a synthetic suite (in memory) and two bf16 hidden-state capture stores (reference,
candidate) into a temporary folder, then times, on one shard holding every context:

1. the scorer alone on tensors already in memory (``score_hidden``);
2. ``shard_positions`` with streaming (prefetching reader, :mod:`harness.scoring.streaming`), with the
   page cache dropped first where that is allowed (``echo 3 > /proc/sys/vm/drop_caches``; the
   output says which condition was measured), and again warm;
3. the old whole-shard path (``load_rows`` everything, then score), cold where possible.

Default: hidden 2048, vocab 8192, 40 contexts of 512 tokens (20,440 positions, 2 x 84 MB).

    python benchmarks/bench_streaming.py --contexts 40 --threads 2
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch


def make_suite(root: Path, n_contexts: int, n_ctx: int, vocab: int) -> object:
    from harness.inputs.suite import ContextInfo, ShardInfo, Suite
    from harness.io.hashing import tokens_sha256

    tokens = np.random.default_rng(0).integers(0, vocab, (n_contexts, n_ctx)).astype(np.uint32)
    contexts = [ContextInfo(i, f"doc{i % 7}", "prose", f"doc{i}.txt", 0) for i in range(n_contexts)]
    shards = [ShardInfo(0, 0, n_contexts, tokens_sha256(tokens))]
    return Suite(root, n_ctx, vocab, "0" * 64, 1, contexts, shards, tokens_sha256(tokens), tokens)


def write_store(path: Path, suite: object, hidden: int, noise: float) -> None:
    from harness.capture.store import StoreWriter
    from harness.engines.identity import runtime_identity

    with StoreWriter(path, suite, "hidden_states", hidden, "bfloat16",
                     {"name": path.name, "config_sha256": "0" * 64, "weights": {}}, {"name": "synthetic", "version": "0"},
                     runtime_identity(), "cpu") as w:
        for i in range(suite.n_contexts):  # type: ignore[attr-defined]
            g = torch.Generator().manual_seed(i)
            x = torch.randn(suite.n_ctx - 1, hidden, generator=g)  # type: ignore[attr-defined]
            if noise:
                x = x + noise * torch.randn(x.shape, generator=torch.Generator().manual_seed(10_000 + i))
            w.write(i, x.bfloat16())


def _cached_mib() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("Cached:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def drop_caches() -> bool:
    """Drop the page cache (root only); prints the 'Cached' figure of /proc/meminfo around it."""
    import os

    before = _cached_mib()
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
    except OSError as e:
        print(f"drop_caches refused ({e}): measuring warm")
        return False
    print(f"drop_caches: page cache {before:.0f} MiB -> {_cached_mib():.0f} MiB")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--contexts", type=int, default=40)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--chunk-mib", type=float, default=8.0, help="streaming chunk size per store")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the stores (default: a temp dir)")
    a = ap.parse_args(argv)

    import harness.scoring.groups as groups
    from harness.capture.store import CaptureStore
    from harness.run.shard import shard_positions
    from harness.run.shard_inputs import ShardInputs
    from harness.scoring.scorer import score_hidden

    torch.set_num_threads(a.threads)
    tmp = Path(tempfile.mkdtemp(prefix="fidelity-stream-", dir=a.dir))
    try:
        suite = make_suite(tmp, a.contexts, a.n_ctx, a.vocab)
        t0 = time.perf_counter()
        write_store(tmp / "ref", suite, a.hidden, 0.0)
        write_store(tmp / "cand", suite, a.hidden, 0.05)
        size = sum(f.stat().st_size for f in tmp.rglob("*.safetensors"))
        n = a.contexts * (a.n_ctx - 1)
        print(f"shape: {a.contexts} contexts x {a.n_ctx - 1} rows = {n} positions, hidden {a.hidden}, vocab {a.vocab}, bf16; "
              f"threads {a.threads}; stores {size / 2**20:.0f} MiB on disk (written in {time.perf_counter() - t0:.1f} s)")
        g = torch.Generator().manual_seed(1)
        head = SimpleNamespace(weight=(torch.randn(a.vocab, a.hidden, generator=g) / a.hidden**0.5 * 4).bfloat16(), sha256="x")
        ref = CaptureStore.open(tmp / "ref", suite, verify=False)
        cand = CaptureStore.open(tmp / "cand", suite, verify=False)
        inputs = ShardInputs(suite=suite, shard=0, reference=ref, candidate=cand, head=head)
        targets = torch.from_numpy(suite.tokens[:, 1:].astype(np.int64).reshape(-1))

        # 1. the scorer alone, inputs in memory
        r_all, c_all = ref.load_rows(list(range(a.contexts))), cand.load_rows(list(range(a.contexts)))
        score_hidden(r_all[:16], c_all[:16], head.weight, targets[:16])
        t0 = time.perf_counter()
        base = score_hidden(r_all, c_all, head.weight, targets)
        t_score = time.perf_counter() - t0
        del r_all, c_all

        # 2. streaming, cold then warm
        groups.STREAM_MIN_BYTES = 0
        groups.CHUNK_BYTES = int(a.chunk_mib * 2**20)
        cold = drop_caches()
        t0 = time.perf_counter()
        sp = shard_positions(inputs)
        t_stream_cold = time.perf_counter() - t0
        assert np.allclose(sp.scores.kld, base.kld, rtol=1e-6, atol=1e-9)
        wait_cold = sp.load_s
        t0 = time.perf_counter()
        sp = shard_positions(inputs)
        t_stream_warm = time.perf_counter() - t0
        wait_warm = sp.load_s

        # 3. whole-shard load, then score (the path before streaming)
        groups.STREAM_MIN_BYTES = 1 << 62
        cold3 = drop_caches()
        t0 = time.perf_counter()
        sp3 = shard_positions(inputs)
        t_whole = time.perf_counter() - t0

        cond = "page cache dropped (cold)" if cold else "page cache NOT dropped (drop_caches refused: warm)"
        print(f"scorer alone (inputs in memory)      {t_score:8.2f} s   {n / t_score:9.1f} positions/s")
        print(f"streamed shard_positions, {'cold' if cold else 'warm*'}       {t_stream_cold:8.2f} s   {n / t_stream_cold:9.1f} positions/s"
              f"   ({t_stream_cold / t_score:.3f} x scorer; unhidden load wait {wait_cold:.2f} s; {cond})")
        print(f"streamed shard_positions, warm       {t_stream_warm:8.2f} s   {n / t_stream_warm:9.1f} positions/s"
              f"   ({t_stream_warm / t_score:.3f} x scorer; unhidden load wait {wait_warm:.2f} s)")
        print(f"whole-shard load then score, {'cold' if cold3 else 'warm*'}    {t_whole:8.2f} s   {n / t_whole:9.1f} positions/s"
              f"   ({t_whole / t_score:.3f} x scorer; load {sp3.load_s:.2f} s not overlapped)")
        print(f"chunk {a.chunk_mib:g} MiB per store ({max(1, int(a.chunk_mib * 2**20) // ((a.n_ctx - 1) * a.hidden * 2))} contexts), "
              f"queue depth 2; goal: streamed end-to-end within 10% of the scorer alone")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
