"""The exact scorer at 27B widths: hidden 5,120, vocabulary 248,320, one 2,048-token context.

Side by side in one run, repetitions interleaved, each figure the median (min, max):

* ``bare``    -- the two bare bf16 GEMMs ``h @ head.T`` of one context (reference and candidate),
  bf16 logits, one call per side: the hardware's fastest product (inexact, the floor);
* ``gemm``    -- the scorer's own two GEMMs alone (fp32 logits, its GEMM path and tiling);
* ``scorer``  -- ``score_hidden``: both GEMMs and every metric;
* ``onednn``  -- (``--onednn``) oneDNN's bf16 mode for fp32 matmuls on a ``1/8`` vocabulary
  slice, against the bare bf16 GEMM on the same slice (the previous CPU path; a whole widened
  head would not fit the memory budget).

Exactness: the scorer's mean KLD over ``--check-rows`` rows against float64 logits (computed
in vocabulary chunks), relative difference. Memory: peak resident set of the process.

    python benchmarks/bench_wide_scorer.py                       # 2,047 rows, 3 repetitions
    python benchmarks/bench_wide_scorer.py --rows 512 --reps 2   # a quarter of a context

Needs about 2.5 GB for the head, 1 GB for the bare GEMMs' output and the scorer's tiles
(``2 x tile_rows x vocab`` fp32: 0.5 GB at 256 rows).
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
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.scoring.bench import make_inputs  # noqa: E402
from harness.scoring.gemm import gemm_mode  # noqa: E402
from harness.scoring.scorer import bare_gemms, score_hidden, scorer_run  # noqa: E402


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _bare(ref: torch.Tensor, cand: torch.Tensor, head: torch.Tensor, out: torch.Tensor) -> float:
    dev = head.device
    _sync(dev)
    t0 = time.perf_counter()
    torch.mm(ref, head.t(), out=out)
    torch.mm(cand, head.t(), out=out)
    _sync(dev)
    return time.perf_counter() - t0


def _timed_scorer(ref: torch.Tensor, cand: torch.Tensor, head: torch.Tensor, y: torch.Tensor, tile: int | None) -> float:
    dev = head.device
    _sync(dev)
    t0 = time.perf_counter()
    score_hidden(ref, cand, head, y, tile_rows=tile, backend="torch")
    _sync(dev)
    return time.perf_counter() - t0


def _onednn_slice(ref: torch.Tensor, head: torch.Tensor) -> tuple[float, float]:
    """(bare bf16, oneDNN bf16-mode fp32) seconds for one side on a 1/8 vocabulary slice."""
    w = head[: head.shape[0] // 8]
    wf, hf = w.float(), ref.float()
    out_b = torch.empty(ref.shape[0], w.shape[0], dtype=torch.bfloat16)
    out_f = torch.empty(ref.shape[0], w.shape[0])
    t0 = time.perf_counter()
    torch.mm(ref, w.t(), out=out_b)
    t1 = time.perf_counter()
    with gemm_mode("onednn-bf16"):
        torch.mm(hf, wf.t(), out=out_f)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


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


def _mmm(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f})"


def _ratio(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2047, help="scored rows (one context of 2,048 tokens: 2,047)")
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--vocab", type=int, default=248_320)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tile-rows", type=int, default=None, help="scorer tile (default: the scorer's own)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--check-rows", type=int, default=4, help="rows checked against float64 (0: skip)")
    p.add_argument("--onednn", action="store_true", help="also time oneDNN's bf16 mode on a vocabulary slice")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    t_make = time.perf_counter()
    ref, cand, head, y = make_inputs(a.rows, a.hidden, a.vocab, device=dev)
    t_make = time.perf_counter() - t_make
    run = scorer_run(ref, cand, head, device=dev, backend="torch")
    out_bf16 = torch.empty(a.rows, a.vocab, dtype=torch.bfloat16, device=dev)
    with torch.inference_mode():
        _bare(ref[:64], cand[:64], head, out_bf16[:64])  # warm-up (thread pools, kernels)
        score_hidden(ref[:64], cand[:64], head, y[:64], tile_rows=a.tile_rows, backend="torch")
        t_bare: list[float] = []
        t_gemm: list[float] = []
        t_score: list[float] = []
        t_slice: list[tuple[float, float]] = []
        for _ in range(a.reps):
            t_bare.append(_bare(ref, cand, head, out_bf16))
            t_gemm.append(bare_gemms(ref, cand, head, tile_rows=a.tile_rows))
            t_score.append(_timed_scorer(ref, cand, head, y, a.tile_rows))
            if a.onednn and dev.type == "cpu":
                t_slice.append(_onednn_slice(ref, head))
    del out_bf16
    rel = float("nan")
    if a.check_rows:
        k = min(a.check_rows, a.rows)
        s = score_hidden(ref[:k], cand[:k], head, y[:k], tile_rows=a.tile_rows, backend="torch")
        exact = _float64_kld(ref[:k], cand[:k], head)
        rel = abs(float(s.kld.mean()) - float(exact.mean())) / float(exact.mean())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    flops = 4.0 * a.rows * a.hidden * a.vocab
    fig = {
        "geometry": {"rows": a.rows, "hidden": a.hidden, "vocab": a.vocab, "tile_rows": a.tile_rows},
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "load_average": os.getloadavg(), "torch": torch.__version__, "device": str(dev)},
        "scorer": run.as_dict(),
        "seconds": {"bare_bf16": t_bare, "scorer_gemms": t_gemm, "scorer": t_score},
        "ratios": {"scorer_over_bare": _ratio(t_score, t_bare), "gemms_over_bare": _ratio(t_gemm, t_bare),
                   "metric_share": [1 - g / s for g, s in zip(t_gemm, t_score, strict=True)]},
        "bare_tflops": [flops / t / 1e12 for t in t_bare],
        "mean_kld_rel_diff_vs_float64": rel,
        "peak_rss_gib": peak,
        "input_build_s": t_make,
    }
    if t_slice:
        fig["onednn_slice"] = {"bare_bf16": [b for b, _ in t_slice], "onednn_bf16_mode": [o for _, o in t_slice],
                               "ratio": [o / b for b, o in t_slice]}
    print(f"geometry: {a.rows} rows x hidden {a.hidden} x vocab {a.vocab}; scorer {run.backend}/{run.gemm}; "
          f"tile_rows {a.tile_rows or 'default'}; threads {torch.get_num_threads()}; load {os.getloadavg()[0]:.1f}")
    print(f"two bare bf16 GEMMs (bf16 logits)   {_mmm(t_bare)}  ({statistics.median(fig['bare_tflops']):.2f} TFLOP/s)")
    print(f"scorer's two GEMMs (fp32 logits)    {_mmm(t_gemm)}")
    print(f"scorer, every metric                {_mmm(t_score)}")
    r = fig["ratios"]
    for name in ("scorer_over_bare", "gemms_over_bare", "metric_share"):
        xs = r[name]
        print(f"{name:35s} {statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})")
    if t_slice:
        xs = fig["onednn_slice"]["ratio"]
        print(f"oneDNN bf16 mode / bare, 1/8 vocab   {statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})")
    print(f"mean KLD vs float64 ({a.check_rows} rows): relative difference {rel:.2e}")
    print(f"peak RSS {peak:.2f} GiB")
    if a.json:
        a.json.write_text(json.dumps(fig, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
