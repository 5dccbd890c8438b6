"""The exact scorer at 27B widths: hidden 5,120, vocabulary 248,320, one 2,048-token context.

Side by side in one run, repetitions interleaved, each figure the median (min, max) of its
repetitions and each ratio taken within one repetition:

* ``bare``     -- the two bare bf16 GEMMs ``h @ head.T`` of one context (reference and candidate),
  bf16 logits, one call per side (inexact, the floor where bf16 is native). Where bf16 is emulated
  (an AVX2-only CPU: tens of times slower than fp32) it is timed on ``1/--bf16-slice`` of the
  vocabulary and scaled by the FLOPs (said so in the output);
* ``bare_fp32`` -- the two bare fp32 GEMMs of the same operands widened to fp32 (fp32 logits), the
  head widened an eighth of the vocabulary at a time outside the timing (no 5 GB copy): the GEMM an
  AVX2-only CPU has. Every figure is also given as a ratio to the faster of the two bare GEMMs
  (``machine``: the GEMM this machine has);
* ``gemm``     -- the scorer's own two GEMMs alone (fp32 logits, its GEMM path and tiling);
* ``eager``    -- ``score_hidden`` with the eager metric pass (``FIDELITY_METRIC_KERNEL=eager``);
* ``inductor`` -- ``score_hidden`` with the compiled metric kernel (``FIDELITY_METRIC_KERNEL=inductor``;
  compiled once before the timed repetitions, the compile time reported apart);
* ``onednn``   -- (``--onednn``) oneDNN's bf16 mode for fp32 matmuls on a ``1/8`` vocabulary
  slice, against the bare bf16 GEMM on the same slice (the previous CPU path).

Every figure is taken twice: wall-clock seconds, and the process's CPU seconds
(``time.process_time``, every thread). On a machine whose cores are shared with other jobs, wall
time measures the scheduler as much as the code; CPU time of a one-thread run (``--threads 1``)
measures the work. With more threads, CPU time also counts OpenMP threads spinning at barriers.
The load average is printed before and after.

Exactness: the scorer's mean KLD over ``--check-rows`` rows against float64 logits (computed
in vocabulary chunks), relative difference, for both metric passes. Memory: peak resident set.

    python benchmarks/bench_wide_scorer.py --threads 1              # 2,047 rows, 2 repetitions
    python benchmarks/bench_wide_scorer.py --rows 512 --reps 1     # a quarter of a context

The machine kind is the process's: with ``ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
ATEN_CPU_CAPABILITY=avx2`` oneDNN, MKL and ATen (and inductor) run as on an AVX2-only CPU (torch's
fp32 GEMM is MKL's sgemm, which the oneDNN limit does not reach).

Needs about 2.5 GB for the head, 1 GB for the bare GEMMs' output and 1 GB for the scorer's tiles.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.engines.bf16_path import cpu_bf16_flags, native_bf16  # noqa: E402
from harness.scoring.bench import make_inputs  # noqa: E402
from harness.scoring.gemm import gemm_mode  # noqa: E402
from harness.scoring.scorer import bare_gemms, score_hidden, scorer_run  # noqa: E402

#: The variables that hold oneDNN, MKL and ATen below the CPU's instruction set (an AVX2-only CPU's kernels).
ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")

#: A wall-clock and a CPU-time reading, seconds.
Timing = tuple[float, float]


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(fn: Callable[[], object], dev: torch.device) -> Timing:
    """(wall seconds, process CPU seconds) of ``fn()``."""
    _sync(dev)
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    _sync(dev)
    return time.perf_counter() - w0, time.process_time() - c0


def _bare(ref: torch.Tensor, cand: torch.Tensor, head: torch.Tensor, out: torch.Tensor) -> None:
    torch.mm(ref, head.t(), out=out)
    torch.mm(cand, head.t(), out=out)


def _score(kernel: str, ref: torch.Tensor, cand: torch.Tensor, head: torch.Tensor, y: torch.Tensor,
           tile: int | None) -> object:
    os.environ["FIDELITY_METRIC_KERNEL"] = kernel
    return score_hidden(ref, cand, head, y, tile_rows=tile, backend="torch")


def _bare_fp32(ref: torch.Tensor, cand: torch.Tensor, head: torch.Tensor, parts: int = 8) -> Timing:
    """Two fp32 GEMMs over the widened operands (fp32 logits), the head widened ``1/parts`` at a time
    outside the timing; (wall, CPU) seconds summed over the parts."""
    rf, cf = ref.float(), cand.float()
    step = -(-head.shape[0] // parts)
    out = torch.empty(ref.shape[0], step, dtype=torch.float32, device=head.device)
    wall = cpu = 0.0
    for v0 in range(0, head.shape[0], step):
        w = head[v0 : v0 + step].float()
        tw, tc = _timed(partial(_bare, rf, cf, w, out[:, : w.shape[0]]), head.device)
        wall, cpu = wall + tw, cpu + tc
    return wall, cpu


def _onednn_slice(ref: torch.Tensor, head: torch.Tensor) -> tuple[Timing, Timing]:
    """(bare bf16, oneDNN bf16-mode fp32) timings for one side on a 1/8 vocabulary slice."""
    w = head[: head.shape[0] // 8]
    wf, hf = w.float(), ref.float()
    out_b = torch.empty(ref.shape[0], w.shape[0], dtype=torch.bfloat16)
    out_f = torch.empty(ref.shape[0], w.shape[0])
    bare = _timed(lambda: torch.mm(ref, w.t(), out=out_b), head.device)

    def onednn() -> None:
        with gemm_mode("onednn-bf16"):
            torch.mm(hf, wf.t(), out=out_f)

    return bare, _timed(onednn, head.device)


def _float64_kld(ref: torch.Tensor, cand: torch.Tensor, head: torch.Tensor, chunk: int = 8192) -> np.ndarray:
    """KL(p||q) per row from float64 logits of the bf16 operands (exact products and sums)."""
    a, b = ref.double().cpu(), cand.double().cpu()
    la = torch.empty(a.shape[0], head.shape[0], dtype=torch.float64)
    lb = torch.empty_like(la)
    for v0 in range(0, head.shape[0], chunk):
        w = head[v0 : v0 + chunk].double().cpu()
        la[:, v0 : v0 + chunk] = a @ w.T
        lb[:, v0 : v0 + chunk] = b @ w.T
    lp = torch.log_softmax(la, 1)
    lq = torch.log_softmax(lb, 1)
    return (lp.exp() * (lp - lq)).sum(1).numpy()


def _mmm(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, default=2047, help="scored rows (one context of 2,048 tokens: 2,047)")
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--vocab", type=int, default=248_320)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--tile-rows", type=int, default=None, help="scorer tile (default: the scorer's own)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    p.add_argument("--check-rows", type=int, default=4, help="rows checked against float64 (0: skip)")
    p.add_argument("--kernels", default="eager,inductor", help="metric passes to time (eager, inductor)")
    p.add_argument("--onednn", action="store_true", help="also time oneDNN's bf16 mode on a vocabulary slice")
    p.add_argument("--bf16-slice", type=int, default=None,
                   help="time the bare bf16 GEMMs on 1/K of the vocabulary and scale by FLOPs (default: 1 where bf16 is "
                        "native, 256 where it is emulated)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    kernels = [k.strip() for k in a.kernels.split(",") if k.strip()]
    dev = torch.device(a.device)
    load_before = os.getloadavg()
    t_make = time.perf_counter()
    ref, cand, head, y = make_inputs(a.rows, a.hidden, a.vocab, device=dev)
    t_make = time.perf_counter() - t_make
    run = scorer_run(ref, cand, head, device=dev, backend="torch")
    native = dev.type != "cpu" or native_bf16()
    k_slice = a.bf16_slice or (1 if native else 256)
    head_b = head[: -(-a.vocab // k_slice)]  # the bare bf16 GEMMs' head (all of it unless sliced)
    scale_b = a.vocab / head_b.shape[0]
    out_bf16 = torch.empty(a.rows, head_b.shape[0], dtype=torch.bfloat16, device=dev)
    compile_s: dict[str, float] = {}
    with torch.inference_mode():
        _bare(ref[:64], cand[:64], head_b, out_bf16[:64])  # warm-up (thread pools, kernels)
        _bare_fp32(ref[:64], cand[:64], head[:4096])
        for k in kernels:  # warm-up; the first inductor call compiles the metric kernel
            compile_s[k] = _timed(partial(_score, k, ref[:64], cand[:64], head, y[:64], a.tile_rows), dev)[0]
        names = ["bare", "bare_fp32", "gemm", *kernels]
        steps: dict[str, Callable[[], object]] = {
            "bare": lambda: _bare(ref, cand, head_b, out_bf16),
            "gemm": lambda: bare_gemms(ref, cand, head, tile_rows=a.tile_rows),
            **{k: partial(_score, k, ref, cand, head, y, a.tile_rows) for k in kernels},
        }
        t: dict[str, list[Timing]] = {n: [] for n in names}
        t_slice: list[tuple[Timing, Timing]] = []
        for _ in range(a.reps):
            for n in names:
                if n == "bare_fp32":
                    t[n].append(_bare_fp32(ref, cand, head))
                elif n == "bare":
                    tw, tc = _timed(steps[n], dev)
                    t[n].append((tw * scale_b, tc * scale_b))
                else:
                    t[n].append(_timed(steps[n], dev))
                print(f"  {n}: wall {t[n][-1][0]:.2f} s, CPU {t[n][-1][1]:.2f} s, load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
            if a.onednn and dev.type == "cpu":
                t_slice.append(_onednn_slice(ref, head))
    rel: dict[str, float] = {}
    if a.check_rows:
        k_rows = min(a.check_rows, a.rows)
        exact = _float64_kld(ref[:k_rows], cand[:k_rows], head)
        for k in kernels:
            s = _score(k, ref[:k_rows], cand[:k_rows], head, y[:k_rows], a.tile_rows)
            rel[k] = abs(float(s.kld.mean()) - float(exact.mean())) / float(exact.mean())  # type: ignore[attr-defined]
    os.environ.pop("FIDELITY_METRIC_KERNEL", None)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    flops = 4.0 * a.rows * a.hidden * a.vocab
    load_after = os.getloadavg()
    seconds = {clock: {n: [x[i] for x in t[n]] for n in names} for i, clock in enumerate(("wall", "cpu"))}
    ratios = {clock: {f"{n}_over_bare": [x / b for x, b in zip(seconds[clock][n], seconds[clock]["bare"], strict=True)]
                      for n in names if n != "bare"} for clock in seconds}
    for clock in seconds:  # the GEMM this machine has: the faster bare GEMM of each repetition
        fast = [min(b, f) for b, f in zip(seconds[clock]["bare"], seconds[clock]["bare_fp32"], strict=True)]
        for n in names:
            ratios[clock][f"{n}_over_bare_fp32"] = [x / f for x, f in zip(seconds[clock][n], seconds[clock]["bare_fp32"], strict=True)]
            ratios[clock][f"{n}_over_machine"] = [x / m for x, m in zip(seconds[clock][n], fast, strict=True)]
    fig: dict[str, Any] = {
        "geometry": {"rows": a.rows, "hidden": a.hidden, "vocab": a.vocab, "tile_rows": a.tile_rows},
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "native_bf16": native, "cpu_bf16_flags": list(cpu_bf16_flags()),
                    "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
                    "isa_env": {k: os.environ.get(k, "") for k in ISA_ENV},
                    "bare_bf16_vocab_fraction": 1 / k_slice,
                    "load_average_before": load_before, "load_average_after": load_after,
                    "torch": torch.__version__, "device": str(dev)},
        "scorer": run.as_dict(),
        "metric_kernels": kernels,
        "seconds": seconds,
        "ratios": ratios,
        "metric_pass_over_bare": {clock: {k: [(s_ - g) / b for s_, g, b in zip(seconds[clock][k], seconds[clock]["gemm"],
                                                                              seconds[clock]["bare"], strict=True)]
                                          for k in kernels} for clock in seconds},
        "bare_tflops_wall": [flops / x for x in seconds["wall"]["bare"]],
        "warmup_s": compile_s,
        "mean_kld_rel_diff_vs_float64": rel,
        "peak_rss_gib": peak,
        "input_build_s": t_make,
    }
    if t_slice:
        fig["onednn_slice"] = {"cpu_ratio": [o[1] / b[1] for b, o in t_slice], "wall_ratio": [o[0] / b[0] for b, o in t_slice]}
    print(f"geometry: {a.rows} rows x hidden {a.hidden} x vocab {a.vocab}; GEMM path {run.gemm}; "
          f"tile_rows {a.tile_rows or 'default'}; threads {torch.get_num_threads()}")
    print(f"machine: {platform.processor() or platform.machine()}, bf16 flags {list(cpu_bf16_flags()) or 'none'}, "
          f"native bf16 {native}, ATen {torch.backends.cpu.get_cpu_capability()}; "
          + ", ".join(f"{k}={os.environ.get(k, '')!r}" for k in ISA_ENV)
          + ("" if k_slice == 1 else f"; bare bf16 GEMMs timed on 1/{k_slice} of the vocabulary, scaled by FLOPs"))
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} ({os.cpu_count()} cores)")
    labels = {"bare": "two bare bf16 GEMMs (bf16 logits)", "bare_fp32": "two bare fp32 GEMMs (widened operands)",
              "gemm": f"scorer's two GEMMs ({run.gemm}, fp32)",
              "eager": "scorer, eager metric pass", "inductor": "scorer, compiled metric kernel"}
    print(f"{'':44s} {'wall s':>20s} {'CPU s':>20s} {'CPU / bare bf16':>20s} {'CPU / bare fp32':>20s} "
          f"{'CPU / machine':>20s} {'wall / machine':>20s}")
    for n in names:
        rc = ratios["cpu"].get(f"{n}_over_bare", [1.0])
        print(f"{labels.get(n, n):44s} {_mmm(seconds['wall'][n]):>20s} {_mmm(seconds['cpu'][n]):>20s} "
              f"{_mmm(rc, '{:.3f}'):>20s} {_mmm(ratios['cpu'][f'{n}_over_bare_fp32'], '{:.3f}'):>20s} "
              f"{_mmm(ratios['cpu'][f'{n}_over_machine'], '{:.3f}'):>20s} "
              f"{_mmm(ratios['wall'][f'{n}_over_machine'], '{:.3f}'):>20s}")
    print("machine: the faster bare GEMM of each repetition ("
          + ("bf16" if statistics.median(seconds["cpu"]["bare"]) < statistics.median(seconds["cpu"]["bare_fp32"]) else "fp32")
          + " here)")
    for k in kernels:
        mp = fig["metric_pass_over_bare"]
        print(f"metric pass ({k}) / bare: wall {_mmm(mp['wall'][k], '{:.3f}')}, CPU {_mmm(mp['cpu'][k], '{:.3f}')}")
    print(f"bare GEMMs {statistics.median(fig['bare_tflops_wall']) / 1e12:.2f} TFLOP/s (wall); warm-up / compile s: "
          + ", ".join(f"{k} {v:.1f}" for k, v in compile_s.items()))
    if t_slice:
        print(f"oneDNN bf16 mode / bare, 1/8 vocab: CPU {_mmm(fig['onednn_slice']['cpu_ratio'], '{:.3f}')}")
    for k, r in rel.items():
        print(f"mean KLD vs float64 ({a.check_rows} rows), {k}: relative difference {r:.2e}")
    print(f"peak RSS {peak:.2f} GiB")
    if a.json:
        a.json.write_text(json.dumps(fig, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
