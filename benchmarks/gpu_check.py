#!/usr/bin/env python
"""GPU check of the fused Triton scorer, sized to finish in < 5 minutes on an H100/H200.

    python benchmarks/gpu_check.py            # or: bash benchmarks/gpu_check.sh
    TRITON_INTERPRET=1 python benchmarks/gpu_check.py --dry-run-cpu --positions 64 --hidden 64 \
        --vocab 700 --subset-positions 32 --sweep-positions 32 --reps 1   # the script's own test, on a CPU

Steps (each prints as it goes; a failing step is reported and the rest still run):

1. environment: CUDA device, torch, triton (exits 2 with a clear line when either is missing);
2. agreement, small shape (N 1024, hidden 1024, vocab 50,000 -- not a multiple of any block):
   Triton vs the torch path per position (KL, JSD, EAR, NLLs, argmaxes), with the documented
   tolerance |delta| <= 1e-6 + 1e-4 |value| (NLL: 1e-4 absolute);
3. block sweep of phase 1 at the Qwen shape on a subset (``--sweep-positions``), picking the
   fastest (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages);
4. Qwen shape, hidden 5120, vocab 248,320, ``--positions`` (65,536) bf16:
   two bare cuBLAS GEMMs (bf16 in, bf16 out; and fp32 out, what the torch scorer needs),
   fused phase 1 (KL, top-1, NLL), fused phase 1 + 2 (with JSD, EAR), the torch scorer and the
   two-pass method (both on ``--subset-positions`` and scaled linearly -- they are GEMM-bound);
   agreement of Triton vs torch on the first 1024 positions at this shape;
5. table of ratios (goal: fused phase 1 <= 1.15 x the two bare bf16 GEMMs) and the projection
   to a full shard and a full seed-suite candidate (10,480,640 positions) at the measured rate.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEED_POSITIONS = 10_480_640
# Each program re-reads its [BLOCK_M, hidden] rows of both operands from HBM for every column block
# (they do not fit in shared memory or in an SM's share of L2), so its arithmetic intensity
# against HBM is ~BLOCK_N FLOP/byte; the H200's ridge is ~990 TFLOP/s / 4.8 TB/s ~ 200. Hence
# the BLOCK_N = 256 configurations (more warps to hold two accumulators without spilling).
CONFIGS = [(128, 128, 64, 8, 3), (64, 256, 64, 8, 3), (128, 256, 64, 16, 3), (128, 64, 64, 8, 3), (256, 128, 64, 16, 3)]


def log(msg: str) -> None:
    print(msg, flush=True)


def timed(fn, sync, reps: int = 1) -> float:  # type: ignore[no-untyped-def]
    best = math.inf
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--positions", type=int, default=65_536)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--vocab", type=int, default=248_320)
    ap.add_argument("--subset-positions", type=int, default=8192, help="torch scorer and two-pass run on this many, scaled")
    ap.add_argument("--sweep-positions", type=int, default=8192)
    ap.add_argument("--configs", default=None, help="'BM,BN,BK,W,S;...' to sweep (default: 5 built-in)")
    ap.add_argument("--shard-positions", type=int, default=512 * 511, help="positions of one shard for the projection")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="exercise this script on a CPU under TRITON_INTERPRET=1 at tiny shapes (no timings worth reading)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()

    # 1. environment
    try:
        import torch
    except ImportError:
        log("gpu_check: torch is not installed")
        return 2
    if not torch.cuda.is_available() and not a.dry_run_cpu:
        log(f"gpu_check: CUDA is not available (torch {torch.__version__}); nothing to check on this machine")
        return 2
    from harness.scoring.backends import triton_available

    if not triton_available():
        log("gpu_check: triton is not importable; install it (pip install --no-deps 'triton==3.8.0' or the version "
            "your torch CUDA wheel pins) and rerun")
        return 2
    import numpy as np
    import triton

    from harness.scoring.fused_kl import fused_score
    from harness.scoring.scorer import score_hidden, score_two_pass

    if a.dry_run_cpu:
        dev = torch.device("cpu")
        sync = lambda: None  # noqa: E731
        torch.cuda.empty_cache = lambda: None  # type: ignore[assignment]
        log(f"device: CPU dry run (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}); torch {torch.__version__}; "
            f"triton {triton.__version__}")
    else:
        dev = torch.device("cuda")
        sync = torch.cuda.synchronize
        props = torch.cuda.get_device_properties(dev)
        log(f"device: {props.name}, {props.total_memory / 2**30:.0f} GiB; torch {torch.__version__}; triton {triton.__version__}; "
            f"CUDA {torch.version.cuda}")
    status: dict[str, str] = {}

    def inputs(n: int, h: int, v: int, seed: int = 0):  # type: ignore[no-untyped-def]
        g = torch.Generator(device=dev).manual_seed(seed)
        head = (torch.randn(v, h, device=dev, generator=g) * (4 / h**0.5)).bfloat16()
        ref = torch.randn(n, h, device=dev, generator=g).bfloat16()
        cand = (ref.float() + 0.05 * torch.randn(n, h, device=dev, generator=g)).bfloat16()
        y = torch.randint(0, v, (n,), device=dev, generator=g)
        return ref, cand, head, y

    def agree(tri, tor, label: str) -> bool:  # type: ignore[no-untyped-def]
        ok = True
        parts = []
        for f in ("kld", "jsd_bits", "ear", "nll_ref", "nll_cand"):
            x, y = getattr(tri, f), getattr(tor, f)
            atol = 1e-4 if f.startswith("nll") else 1e-6
            bad = np.abs(x - y) > atol + 1e-4 * np.abs(y)
            ok &= not bad.any()
            parts.append(f"{f} max|d| {np.abs(x - y).max():.1e}" + (f" ({bad.sum()} out)" if bad.any() else ""))
        top = float((tri.argmax_ref == tor.argmax_ref).mean()), float((tri.argmax_cand == tor.argmax_cand).mean())
        parts.append(f"argmax agree {top[0]:.4f}/{top[1]:.4f}")
        log(f"  {label}: {'OK' if ok else 'MISMATCH'}; " + "; ".join(parts))
        return ok

    # 2. agreement, small shape
    try:
        shape = (40, 64, 500) if a.dry_run_cpu else (1024, 1024, 50_000)
        r, c, w, y = inputs(*shape, seed=1)
        t0 = time.perf_counter()
        tri = fused_score(r, c, w, y)
        log(f"agreement (N {shape[0]}, hidden {shape[1]}, vocab {shape[2]}; first call incl. compile "
            f"{time.perf_counter() - t0:.1f} s):")
        tor = score_hidden(r, c, w, y, backend="torch")
        ident = fused_score(r, r, w, y)
        status["agreement"] = "OK" if agree(tri, tor, "triton vs torch") else "MISMATCH"
        log(f"  identical operands: max KL {ident.kld.max():.1e}, min EAR {ident.ear.min():.9f}")
        del r, c, w, y
    except Exception:
        status["agreement"] = "ERROR"
        traceback.print_exc()

    n, h, v = a.positions, a.hidden, a.vocab
    log(f"\n{'Qwen' if (h, v) == (5120, 248_320) else 'Given'} shape: positions {n}, hidden {h}, vocab {v}, bf16 "
        f"({4 * h * v * n / 1e12:.1f} TFLOP for the two GEMMs)")
    ref, cand, head, y = inputs(n, h, v)
    flops = 4.0 * h * v

    # 3. sweep
    if a.dry_run_cpu and a.configs is None:
        a.configs = "16,64,32,1,1;32,64,32,1,1"
    configs = CONFIGS if a.configs is None else [tuple(int(x) for x in s.split(",")) for s in a.configs.split(";")]
    best_cfg, best_t = None, math.inf
    m = min(a.sweep_positions, n)
    log(f"phase-1 block sweep on {m} positions (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages):")
    for cfg in configs:
        try:
            t0 = time.perf_counter()
            fused_score(ref[:m], cand[:m], head, y[:m], jsd_ear=False, blocks=cfg)  # compile
            tc = time.perf_counter() - t0
            t = timed(lambda cfg=cfg: fused_score(ref[:m], cand[:m], head, y[:m], jsd_ear=False, blocks=cfg), sync, a.reps)
            log(f"  {cfg}: {t * 1e3:8.1f} ms  ({m * flops / t / 1e12:6.1f} TFLOP/s; compile+first {tc:.1f} s)")
            if t < best_t:
                best_cfg, best_t = cfg, t
        except Exception as e:  # e.g. out of shared memory / registers for this config
            log(f"  {cfg}: failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
    if best_cfg is None:
        log("no block configuration ran; stopping")
        return 1
    log(f"  best: {best_cfg}  (set FIDELITY_FUSED_BLOCKS={','.join(map(str, best_cfg))} to use it by default)")

    # 4. full shape timings
    res: dict[str, float] = {}
    tile = min(4096, n)

    def bare(out_dtype):  # type: ignore[no-untyped-def]
        buf_a = torch.empty(tile, v, device=dev, dtype=out_dtype)
        buf_b = torch.empty(tile, v, device=dev, dtype=out_dtype)

        def run() -> None:
            for r0 in range(0, n, tile):
                k = min(n, r0 + tile) - r0
                if out_dtype == torch.bfloat16:
                    torch.mm(ref[r0 : r0 + k], head.t(), out=buf_a[:k])
                    torch.mm(cand[r0 : r0 + k], head.t(), out=buf_b[:k])
                else:
                    buf_a[:k].copy_(torch.mm(ref[r0 : r0 + k], head.t(), out_dtype=torch.float32))
                    buf_b[:k].copy_(torch.mm(cand[r0 : r0 + k], head.t(), out_dtype=torch.float32))
        return run

    steps = [
        ("bare cuBLAS GEMMs, bf16 out", lambda: timed(bare(torch.bfloat16), sync, a.reps), 1.0),
        ("bare cuBLAS GEMMs, fp32 out", lambda: timed(bare(torch.float32), sync, a.reps), 1.0),
        ("fused phase 1 (KL, top-1, NLL)", lambda: timed(lambda: fused_score(ref, cand, head, y, jsd_ear=False, blocks=best_cfg), sync, a.reps), 1.0),
        ("fused phase 1 + 2 (all metrics)", lambda: timed(lambda: fused_score(ref, cand, head, y, blocks=best_cfg), sync, 1), 1.0),
    ]
    s = min(a.subset_positions, n)
    steps += [
        (f"torch scorer (x{n / s:g} from {s})", lambda: timed(lambda: score_hidden(ref[:s], cand[:s], head, y[:s], backend="torch", tile_rows=2048), sync, 1), n / s),
        (f"two-pass method (x{n / s:g} from {s})", lambda: timed(lambda: score_two_pass(ref[:s], cand[:s], head, tile_rows=2048, vocab_chunk=32768), sync, 1), n / s),
    ]
    for name, fn, scale in steps:
        try:
            res[name] = fn() * scale
            log(f"  {name:40s} {res[name]:9.3f} s")
        except Exception as e:
            log(f"  {name:40s} failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
        torch.cuda.empty_cache()
    try:
        k = min(1024, n)
        agree(fused_score(ref[:k], cand[:k], head, y[:k], blocks=best_cfg), score_hidden(ref[:k], cand[:k], head, y[:k], backend="torch"),
              f"triton vs torch at the Qwen shape, first {k} positions")
    except Exception:
        traceback.print_exc()

    # 5. table
    g16 = res.get("bare cuBLAS GEMMs, bf16 out")
    p1 = res.get("fused phase 1 (KL, top-1, NLL)")
    full = res.get("fused phase 1 + 2 (all metrics)")
    log("\n| figure | value |\n|---|---|")
    for name, val in res.items():
        log(f"| {name} | {val:.3f} s |")
    if g16 and p1:
        log(f"| fused phase 1 / bare bf16 GEMMs (goal <= 1.15) | {p1 / g16:.3f} |")
    if g16 and full:
        log(f"| fused phase 1+2 / bare bf16 GEMMs | {full / g16:.3f} |")
    tp = next((v_ for k_, v_ in res.items() if k_.startswith("two-pass")), None)
    ts = next((v_ for k_, v_ in res.items() if k_.startswith("torch scorer")), None)
    if tp and p1:
        log(f"| two-pass / fused phase 1 | {tp / p1:.2f} |")
    if ts and full:
        log(f"| torch scorer / fused phase 1+2 | {ts / full:.2f} |")
    for label, t in (("phase 1 only", p1), ("all metrics", full)):
        if t:
            rate = n / t
            log(f"| positions/s, {label} | {rate:,.0f} ({n * flops / t / 1e12:.0f} TFLOP/s) |")
            log(f"| projection, one shard of {a.shard_positions:,} positions, {label} | {a.shard_positions / rate:.1f} s |")
            log(f"| projection, seed-suite candidate ({SEED_POSITIONS:,} positions), {label} | {SEED_POSITIONS / rate / 60:.1f} min |")
    log(f"\nstatus: agreement {status.get('agreement')}; best blocks {best_cfg}; wall {time.perf_counter() - t_start:.0f} s")
    return 0 if status.get("agreement") == "OK" else 1


if __name__ == "__main__":
    if "--dry-run-cpu" not in sys.argv:
        os.environ.pop("TRITON_INTERPRET", None)  # (read at triton import; the real check runs compiled)
    raise SystemExit(main())
