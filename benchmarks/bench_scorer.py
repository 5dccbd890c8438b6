#!/usr/bin/env python
"""Scorer performance, measured side by side in one run (docs/design.md, section 6).

Prints four figures:

1. scorer time / two bare GEMMs time (the floor: reference and candidate logits, tiled alike);
   goal <= 1.2 on a CPU;
2. two-pass method time / scorer time (normalizers first, then divergences: GEMMs twice);
   goal >= 1.7;
3. peak extra memory of the scorer at N and 4N positions. Each is measured in a fresh child
   process: with inputs, head and torch already resident, the kernel's peak-RSS mark (VmHWM)
   is reset (``echo 5 > /proc/self/clear_refs``, Linux), the scorer runs, and the figure is the
   new VmHWM minus the RSS just before: the growth of the resident set caused by scoring,
   outputs included. This sees torch's allocations, which tracemalloc does not. Where
   clear_refs is unavailable it falls back to the ``ru_maxrss`` delta (inputs are generated in
   chunks so their temporaries do not set the peak). It must not grow with N;
4. bootstrap time for a suite of 5,120 contexts in 842 source clusters: the 10,000-replicate
   cluster bootstrap of the four means, the 2,000-replicate tail bootstrap (p99, CVaR1) and the
   whole ``summarize``.

Timings are the minimum over ``--reps`` interleaved repetitions (the machines are shared and
noisy; the minimum is the least disturbed run). The default shape is Qwen-proportioned but scaled
(hidden 2048, vocab 65,536, 4,096 positions, bf16); shrink with the options.

    python benchmarks/bench_scorer.py --positions 1024 --threads 2

The measuring code lives in :mod:`harness.scoring.bench` (shared with ``fidelity bench``, which adds
positions/s and the seed-suite projection, and runs on CUDA too).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import torch

from harness.scoring.bench import bench_bootstrap, child_memory, make_inputs
from harness.scoring.scorer import bare_gemms, default_tile_rows, score_hidden, score_two_pass

__all__ = ["make_inputs", "bench_bootstrap", "measure_memory", "main"]


def measure_memory(n: int, args: argparse.Namespace) -> dict:
    """Peak extra RSS of one scorer call in a fresh child (see :mod:`harness.scoring.bench`)."""
    cmd = [sys.executable, __file__, "--_child-memory", str(n), "--hidden", str(args.hidden), "--vocab", str(args.vocab),
           "--threads", str(args.threads)]
    if args.tile_rows:
        cmd += ["--tile-rows", str(args.tile_rows)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=65_536)
    ap.add_argument("--positions", type=int, default=4096)
    ap.add_argument("--tile-rows", type=int, default=None)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-bootstrap", action="store_true")
    ap.add_argument("--boot-contexts", type=int, default=5120)
    ap.add_argument("--boot-clusters", type=int, default=842)
    ap.add_argument("--boot-positions-per-context", type=int, default=511)
    ap.add_argument("--_child-memory", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child_memory is not None:
        print(json.dumps(child_memory(args._child_memory, args.hidden, args.vocab, args.tile_rows, args.threads)))
        return 0

    torch.set_num_threads(args.threads)
    n, h, v = args.positions, args.hidden, args.vocab
    tile = args.tile_rows or default_tile_rows(v, 4)
    print(f"shape: positions {n}, hidden {h}, vocab {v}, bf16; tile_rows {tile}; threads {args.threads}; "
          f"torch {torch.__version__}")
    ref, cand, head, targets = make_inputs(n, h, v)
    score_hidden(ref[:16], cand[:16], head, targets[:16])  # warm-up
    t_gemm, t_gemm16, t_score, t_two = [], [], [], []
    for _ in range(args.reps):
        t_gemm.append(bare_gemms(ref, cand, head, tile_rows=tile))
        t_gemm16.append(bare_gemms(ref, cand, head, tile_rows=tile, fp32_logits=False))
        t0 = time.perf_counter()
        s = score_hidden(ref, cand, head, targets, tile_rows=tile)
        t_score.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        k2 = score_two_pass(ref, cand, head, tile_rows=tile)
        t_two.append(time.perf_counter() - t0)
    # the two-pass method works in fp32 log-space (an ulp(lse) ~ 1e-6 offset per position); the
    # scorer cancels the normalizers in float64, so only agreement to that level is expected
    diff = float(np.abs(k2 - s.kld).max())
    assert diff <= 1e-4 + 1e-3 * float(s.kld.max()), f"two-pass and scorer disagree: max |diff| {diff:.3g}"
    g, sc, tw = min(t_gemm), min(t_score), min(t_two)
    g16 = min(t_gemm16)
    print(f"bare GEMMs      {g:8.3f} s   (fp32 logits, as the scorer needs; min of {args.reps}; all {['%.2f' % x for x in t_gemm]})")
    print(f"bare GEMMs bf16 {g16:8.3f} s   (bf16 logits: inexact, shown for the hardware's fastest product)")
    print(f"scorer          {sc:8.3f} s   (all {['%.2f' % x for x in t_score]})")
    print(f"two-pass        {tw:8.3f} s   (all {['%.2f' % x for x in t_two]})")
    print(f"scorer / bare GEMMs     = {sc / g:.3f}   (goal <= 1.2)")
    print(f"scorer / bf16 GEMMs     = {sc / g16:.3f}")
    print(f"two-pass / scorer       = {tw / sc:.3f}   (goal >= 1.7)")
    print(f"scorer per position     = {sc / n * 1e3:.3f} ms; mean KLD {s.kld.mean():.3e}; "
          f"max |two-pass - scorer| {diff:.2e}")
    if not args.skip_memory:
        del ref, cand, head, targets
        m1 = measure_memory(n, args)
        m4 = measure_memory(4 * n, args)
        print(f"peak extra RSS at N={n}: {m1['extra_peak_kib'] / 1024:.1f} MiB; at 4N={4 * n}: "
              f"{m4['extra_peak_kib'] / 1024:.1f} MiB (ratio {m4['extra_peak_kib'] / max(1, m1['extra_peak_kib']):.2f}; "
              f"budget for the two logits tiles {2 * tile * v * 4 / 2**20:.0f} MiB; {m1['method']})")
    if not args.skip_bootstrap:
        b = bench_bootstrap(args.boot_contexts, args.boot_clusters, args.boot_positions_per_context)
        print(f"bootstrap, {args.boot_contexts} contexts / {args.boot_clusters} clusters / {b['positions']} positions: "
              f"means (10,000 replicates, 4 statistics) {b['means_10k_s']:.3f} s; tails (2,000 replicates) "
              f"{b['tails_2k_s']:.3f} s; whole summarize {b['summarize_s']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
