"""Scorer benchmark library (docs/design.md, section 6), shared by ``benchmarks/bench_scorer.py`` and
``fidelity bench``.

Reasoning: docs/performance.md §"The benchmark library".
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from harness.io.jsonio import JSONObject
from harness.metrics import ContextLabel, summarize
from harness.metrics.bootstrap import TailData, draw_cluster_weights, ratio_replicates, tail_replicates
from harness.metrics.scores import PositionScores
from harness.scoring.backends import choose_backend
from harness.scoring.scorer import bare_gemms, default_tile_rows, score_hidden, score_two_pass, scorer_run

__all__ = [
    "SEED_POSITIONS",
    "SEED_SHAPE",
    "SHAPES",
    "BenchResult",
    "bench_bootstrap",
    "format_bench",
    "make_inputs",
    "measure_memory",
    "run_bench",
]

#: Positions per candidate of the seed suite, and its head shape (vocab, hidden).
SEED_POSITIONS = 10_480_640
SEED_SHAPE = (248_320, 5120)
#: Named shapes: (positions, hidden, vocab).
SHAPES: dict[str, tuple[int, int, int]] = {
    "default": (2048, 2048, 65_536),
    "small": (1024, 512, 16_384),
    "scaled": (4096, 2048, 65_536),
    "qwen": (65_536, 5120, 248_320),
}


def flops_per_position(hidden: int, vocab: int) -> float:
    """Two GEMM rows (reference and candidate) against the head: 2 * 2 * hidden * vocab."""
    return 4.0 * hidden * vocab


def make_inputs(n: int, hidden: int, vocab: int, seed: int = 0, device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
    """bf16 head and hidden states, generated 4096 rows at a time (small fp32 temporaries)."""
    g = torch.Generator().manual_seed(seed)
    head = torch.empty(vocab, hidden, dtype=torch.bfloat16, device=device)
    for r in range(0, vocab, 4096):
        head[r : r + 4096] = (torch.randn(min(4096, vocab - r), hidden, generator=g) / hidden**0.5 * 4).to(device)
    ref = torch.empty(n, hidden, dtype=torch.bfloat16, device=device)
    cand = torch.empty(n, hidden, dtype=torch.bfloat16, device=device)
    for r in range(0, n, 4096):
        x = torch.randn(min(4096, n - r), hidden, generator=g)
        ref[r : r + 4096] = x.to(device)
        cand[r : r + 4096] = (x + 0.05 * torch.randn(x.shape, generator=g)).to(device)
    targets = torch.randint(0, vocab, (n,), generator=g).to(device)
    return ref, cand, head, targets


def _status_kib(name: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(name)


def child_memory(n: int, hidden: int, vocab: int, tile_rows: int | None, threads: int, device: str = "cpu",
                 backend: str | None = None) -> JSONObject:
    """Run in the child: peak extra memory of one ``score_hidden`` call (docs/performance.md §"The benchmark library")."""
    torch.set_num_threads(threads)
    ref, cand, head, targets = make_inputs(n, hidden, vocab, device=device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        score_hidden(ref, cand, head, targets, tile_rows=tile_rows, backend=backend)
        torch.cuda.synchronize()
        after = torch.cuda.max_memory_allocated()
        return {"n": n, "extra_peak_kib": (after - before) // 1024, "baseline_kib": before // 1024,
                "method": "torch.cuda.max_memory_allocated"}
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        method = "VmHWM after clear_refs"
        before = _status_kib("VmRSS")
        score_hidden(ref, cand, head, targets, tile_rows=tile_rows, backend=backend)
        after = _status_kib("VmHWM")
    except OSError:
        method = "ru_maxrss delta"
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        score_hidden(ref, cand, head, targets, tile_rows=tile_rows, backend=backend)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"n": n, "extra_peak_kib": after - before, "baseline_kib": before, "method": method}


def measure_memory(n: int, hidden: int, vocab: int, *, tile_rows: int | None = None, threads: int = 1,
                   device: str = "cpu", backend: str | None = None) -> JSONObject:
    """Peak extra memory of scoring ``n`` positions, measured in a fresh child process."""
    cmd = [sys.executable, "-m", "harness.scoring.bench", "--_child-memory", str(n), "--hidden", str(hidden), "--vocab", str(vocab),
           "--threads", str(threads), "--device", device]
    if tile_rows:
        cmd += ["--tile-rows", str(tile_rows)]
    if backend:
        cmd += ["--backend", backend]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def bench_bootstrap(n_contexts: int, n_clusters: int, positions_per_context: int) -> dict[str, float]:
    """Bootstrap timings for a suite of ``n_contexts`` contexts in ``n_clusters`` source clusters."""
    rng = np.random.default_rng(0)
    n = n_contexts * positions_per_context
    s = PositionScores(rng.lognormal(-7, 2, n), rng.random(n), rng.random(n), rng.random(n) * 5, rng.random(n) * 5,
                       rng.integers(0, 4, n), rng.integers(0, 4, n), rng.lognormal(-7, 2, n), rng.random(n) * 5,
                       rng.random(n), rng.random(n), rng.integers(0, 6, n), rng.integers(0, 11, n))
    ctx_cluster = np.concatenate([np.arange(n_clusters), rng.integers(0, n_clusters, n_contexts - n_clusters)])
    labels = [ContextLabel(i, int(ctx_cluster[i]), "prose") for i in range(n_contexts)]
    ci = np.repeat(np.arange(n_contexts), positions_per_context)
    row = np.tile(np.arange(positions_per_context), n_contexts)
    cl = ctx_cluster[ci]
    t0 = time.perf_counter()
    w = draw_cluster_weights(n_clusters, 10_000, 20240601)
    counts = np.bincount(cl, minlength=n_clusters)
    sums = np.stack([np.bincount(cl, weights=v, minlength=n_clusters) for v in (s.kld, s.ear, s.jsd_bits, s.top1.astype(float))], 1)
    ratio_replicates(w, sums, counts)
    t_means = time.perf_counter() - t0
    t0 = time.perf_counter()
    tail_replicates(TailData.build(s.kld, cl, n_clusters), w[:2000])
    t_tails = time.perf_counter() - t0
    t0 = time.perf_counter()
    summarize(s, ci, row, labels)
    t_sum = time.perf_counter() - t0
    return {"positions": n, "means_10k_s": t_means, "tails_2k_s": t_tails, "summarize_s": t_sum}


@dataclass
class BenchResult:
    positions: int
    hidden: int
    vocab: int
    device: str
    backend: str
    threads: int
    tile_rows: int
    reps: int
    gemm_path: str = ""  #: the scorer's GEMM path (harness.scoring.gemm.GEMM_PATHS)
    t_gemm: list[float] = field(default_factory=list)  #: two fp32-output GEMMs on the scorer's path
    t_gemm_fp32: list[float] = field(default_factory=list)  #: two plain fp32 GEMMs (when the path is not fp32)
    t_gemm_bf16: list[float] = field(default_factory=list)
    t_score: list[float] = field(default_factory=list)
    t_score_phase1: list[float] = field(default_factory=list)  # triton only: KL/top-1/NLL pass alone
    t_two_pass: list[float] = field(default_factory=list)
    max_two_pass_diff: float = float("nan")
    mean_kld: float = float("nan")
    memory: list[dict[str, Any]] = field(default_factory=list)

    @property
    def gemm(self) -> float:
        return float(np.median(self.t_gemm))

    @property
    def gemm_bf16(self) -> float:
        return float(np.median(self.t_gemm_bf16))

    @property
    def score(self) -> float:
        return float(np.median(self.t_score))

    @property
    def two_pass(self) -> float:
        return float(np.median(self.t_two_pass))

    def ratios(self) -> dict[str, list[float]]:
        """Per-repetition ratios (each from one interleaved repetition): name -> values."""
        out = {
            "scorer / bare bf16 GEMMs": [s / g for s, g in zip(self.t_score, self.t_gemm_bf16)],
            "scorer / bare fp32-output GEMMs": [s / g for s, g in zip(self.t_score, self.t_gemm)],
            "metric pass share of the scorer": [max(0.0, 1 - g / s) for s, g in zip(self.t_score, self.t_gemm)],
        }
        if self.t_gemm_fp32:
            out["scorer / bare plain fp32 GEMMs"] = [s / g for s, g in zip(self.t_score, self.t_gemm_fp32)]
        if self.t_two_pass:
            out["two-pass / scorer"] = [t / s for s, t in zip(self.t_score, self.t_two_pass)]
        return out

    @property
    def positions_per_s(self) -> float:
        return self.positions / self.score

    def projection_s(self, positions: int = SEED_POSITIONS, shape: tuple[int, int] = SEED_SHAPE) -> float:
        """Seconds for ``positions`` through a ``[vocab, hidden]`` head, scaled by FLOPs (docs/performance.md §"The benchmark library")."""
        ratio = flops_per_position(shape[1], shape[0]) / flops_per_position(self.hidden, self.vocab)
        return positions / self.positions_per_s * ratio

    def to_dict(self) -> JSONObject:
        d = asdict(self)
        d.update(positions_per_s=self.positions_per_s, projection_seed_candidate_s=self.projection_s(),
                 ratios={k: _stats(v) for k, v in self.ratios().items()})
        return d


def _stats(v: list[float]) -> dict[str, float]:
    return {"median": float(np.median(v)), "min": float(min(v)), "max": float(max(v))}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_bench(positions: int, hidden: int, vocab: int, *, device: str = "cpu", backend: str | None = None,
              threads: int | None = None, tile_rows: int | None = None, reps: int = 3, memory: bool = True,
              two_pass: bool = True) -> BenchResult:
    """Time the scorer, the bare GEMMs and the two-pass method side by side (interleaved reps)."""
    threads = int(threads or torch.get_num_threads())
    torch.set_num_threads(threads)
    dev = torch.device(device)
    chosen = choose_backend(backend, dev)
    tile = int(tile_rows or default_tile_rows(vocab, 4))
    res = BenchResult(positions, hidden, vocab, str(dev), chosen, threads, tile, reps)
    ref, cand, head, targets = make_inputs(positions, hidden, vocab, device=dev)
    res.gemm_path = scorer_run(ref, cand, head, device=dev, backend=chosen).gemm
    score_hidden(ref[:16], cand[:16], head, targets[:16], backend=chosen)  # warm-up (and kernel compile)
    if chosen == "triton":
        from harness.scoring.fused_kl import fused_score

        fused_score(ref[:16], cand[:16], head, targets[:16], jsd_ear=False)
    for _ in range(reps):
        res.t_gemm.append(bare_gemms(ref, cand, head, tile_rows=tile))
        if res.gemm_path not in ("fp32", "triton-dot"):
            res.t_gemm_fp32.append(bare_gemms(ref, cand, head, tile_rows=tile, gemm="fp32"))
        res.t_gemm_bf16.append(bare_gemms(ref, cand, head, tile_rows=tile, fp32_logits=False))
        _sync(dev)
        t0 = time.perf_counter()
        s = score_hidden(ref, cand, head, targets, tile_rows=tile, backend=chosen)
        _sync(dev)
        res.t_score.append(time.perf_counter() - t0)
        if chosen == "triton":
            t0 = time.perf_counter()
            fused_score(ref, cand, head, targets, jsd_ear=False)
            _sync(dev)
            res.t_score_phase1.append(time.perf_counter() - t0)
        if two_pass:
            t0 = time.perf_counter()
            k2 = score_two_pass(ref, cand, head, tile_rows=tile)
            _sync(dev)
            res.t_two_pass.append(time.perf_counter() - t0)
            # the two-pass method works in fp32 log-space (an ulp(lse) ~ 1e-6 offset per position)
            res.max_two_pass_diff = float(np.abs(k2 - s.kld).max())
    res.mean_kld = float(s.kld.mean())
    if memory:
        del ref, cand, head, targets
        for n in (positions, 4 * positions):
            res.memory.append(measure_memory(n, hidden, vocab, tile_rows=tile_rows, threads=threads, device=str(dev),
                                             backend=chosen))
    return res


def _fmt_s(sec: float) -> str:
    if sec >= 3600:
        return f"{sec / 3600:.2f} h"
    if sec >= 60:
        return f"{sec / 60:.1f} min"
    return f"{sec:.2f} s"


def _mmm(v: list[float], unit: str = "s") -> str:
    st = _stats(v)
    if unit == "s":
        return f"{st['median']:9.3f} s  (min {st['min']:.3f}, max {st['max']:.3f})"
    return f"{st['median']:.3f}  (min {st['min']:.3f}, max {st['max']:.3f})"


def format_bench(r: BenchResult) -> list[str]:
    """Human-readable lines for :func:`run_bench`'s result (medians of interleaved reps, min and max)."""
    lines = [
        (f"shape: positions {r.positions}, hidden {r.hidden}, vocab {r.vocab}, bf16; device {r.device}; backend {r.backend}; "
         f"GEMM path {r.gemm_path}; tile_rows {r.tile_rows}; threads {r.threads}; torch {torch.__version__}; "
         f"median of {len(r.t_score)} interleaved reps (min, max)"),
        f"bare GEMMs, fp32 logits ({r.gemm_path})  {_mmm(r.t_gemm)}",
    ]
    if r.t_gemm_fp32:
        lines.append(f"bare GEMMs, fp32 logits (plain fp32)  {_mmm(r.t_gemm_fp32)}")
    lines += [
        f"bare GEMMs, bf16 logits               {_mmm(r.t_gemm_bf16)}   (inexact; for reference)",
        f"scorer (every metric)                 {_mmm(r.t_score)}",
    ]
    if r.t_score_phase1:
        lines.append(f"scorer phase 1 only                   {_mmm(r.t_score_phase1)}   (KL, top-1, NLL; no JSD/EAR)")
    if r.t_two_pass:
        lines.append(f"two-pass method (KL only)             {_mmm(r.t_two_pass)}")
    for name, vals in r.ratios().items():
        lines.append(f"{name:<37} = {_mmm(vals, '')}")
    if r.t_score_phase1:
        lines.append(f"phase 1 / bare bf16 GEMMs = {min(r.t_score_phase1) / r.gemm_bf16:.3f}   (fused kernel goal <= 1.15)")
    if r.t_two_pass:
        lines.append(f"max |two-pass - scorer| KLD = {r.max_two_pass_diff:.1e}")
    lines.append(f"positions/s               = {r.positions_per_s:,.0f}   (mean KLD {r.mean_kld:.3e})")
    if r.memory:
        m1, m4 = r.memory
        lines.append(f"peak extra memory         = {m1['extra_peak_kib'] / 1024:.1f} MiB at N={m1['n']}, "
                     f"{m4['extra_peak_kib'] / 1024:.1f} MiB at 4N={m4['n']} (ratio "
                     f"{m4['extra_peak_kib'] / max(1, m1['extra_peak_kib']):.2f}; {m1['method']})")
    proj = r.projection_s()
    lines.append(f"projection: seed suite, {SEED_POSITIONS:,} positions per candidate through [{SEED_SHAPE[0]}, {SEED_SHAPE[1]}]: "
                 f"{_fmt_s(proj)} per candidate on this device (assumes GEMM-bound: time scales with FLOPs = "
                 f"4*hidden*vocab per position, at this run's FLOP rate of {r.positions_per_s * flops_per_position(r.hidden, r.vocab) / 1e12:.3f} TFLOP/s)")
    return lines


def _main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="child process for harness.scoring.bench.measure_memory")
    ap.add_argument("--_child-memory", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tile-rows", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default=None)
    a = ap.parse_args(argv)
    print(json.dumps(child_memory(a._child_memory, a.hidden, a.vocab, a.tile_rows, a.threads, a.device, a.backend)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
