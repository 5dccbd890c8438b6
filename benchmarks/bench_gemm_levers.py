"""fp32-output bf16 GEMMs on a CPU that torch can reach, against the bare bf16 GEMM: a lever survey.

The scorer needs fp32 logits of bf16 operands (docs/performance.md). Its CPU path is MKL's
``cblas_gemm_bf16bf16f32`` (:mod:`harness.scoring.cblas_bf16`), measured slower per FLOP than the
oneDNN kernel ``torch.mm`` runs for a bf16 result. This script times, on one GEMM of ``--rows``
rows x hidden ``--hidden`` x a ``--vocab`` column slice, one thread, CPU time
(``time.process_time``), arms interleaved within each repetition, each ratio taken within one
repetition:

* ``bare``    -- ``torch.mm(a, w.T)`` with a bf16 result (oneDNN; inexact, the floor);
* ``mkl``     -- the scorer's path, ``cblas_gemm_bf16bf16f32`` through ctypes;
* ``inductor``-- inductor's CPP GEMM template (AMX micro-kernel, fp32 accumulators) emitting an
  **fp32** result: a ``torch.library`` custom op whose inductor lowering builds the template
  choice with an fp32 output layout, the head VNNI-packed once in eager torch and passed in (a
  template subclass skips the per-call weight blocking); ``--cache-blocking Mc,Nc,Kc`` sets
  ``torch._inductor.config.cpp.gemm_cache_blocking``; ``--brgemm`` registers oneDNN's brgemm
  micro-kernel for bf16 (inductor enables it only for fp16 with AMX-FP16);
* ``brgemm``  -- ``at::native::cpublas::brgemm`` (oneDNN's brgemm ukernel, bf16 x bf16 -> fp32),
  exported by ``libtorch_cpu.so``, called through ctypes over blocks of 64 columns x
  ``--brgemm-rows`` rows x the whole hidden width, head VNNI-packed once.

Each fp32 arm's result is checked against float64 on 64 rows: the error must lie within the
fp32-accumulation bound ``gamma_K * sum |a||w|`` (gamma_K = K u / (1 - K u), u = 2^-24).

    python benchmarks/bench_gemm_levers.py --reps 3
    python benchmarks/bench_gemm_levers.py --reps 3 --cache-blocking 16,2,20 --brgemm
    python benchmarks/bench_gemm_levers.py --vocab 248320 --reps 2 --arms bare,mkl,inductor

Memory: the head, one packed copy of it per packed arm (``inductor``, ``brgemm``) and the
outputs -- at the full 248,320-token vocabulary 2.5 GB each, so ~6.5 GB with one packed arm and
~10.5 GB with both (run them apart on a small machine).

None of these arms is used by the scorer: this is the measurement behind the lever table.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.scoring import cblas_bf16  # noqa: E402

_LIB = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
_BRGEMM = "_ZN2at6native7cpublas6brgemmEllllllbPKN3c108BFloat16ES5_Pfb"  # brgemm(..., const BFloat16*, ..., float*, bool)
_RELEASE = "_ZN2at6native7cpublas14brgemm_releaseEb"


def vnni_pack(w: torch.Tensor, block_n: int) -> torch.Tensor:
    """``w`` [N, K] bf16 as ``[ceil(N / block_n), K / 2, block_n, 2]``: column blocks, K pairs interleaved (VNNI2)."""
    n, k = w.shape
    pad = (-n) % block_n
    if pad:
        w = torch.nn.functional.pad(w, (0, 0, 0, pad))
    return w.view(-1, block_n, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def inductor_mm(brgemm_micro: bool) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """A compiled ``(a, w, packed) -> a @ w.T`` in fp32 through inductor's CPP GEMM template."""
    import torch._inductor.lowering as lowering  # before the template module, which imports it circularly
    from torch._inductor import ir
    from torch._inductor.codegen.cpp_gemm_template import CppGemmTemplate
    from torch._inductor.kernel.mm_common import mm_args
    from torch._inductor.select_algorithm import autotune_select_algorithm

    if brgemm_micro:  # the patched registry is not part of inductor's cache key
        torch._inductor.config.force_disable_caches = True
        from torch._inductor.codegen import cpp_micro_gemm as cmg
        from torch._inductor.cpu_vec_isa import VecAMX

        def _ok(config: Any, m: int, n: int, k: int, alpha: float, num_threads: int, **kw: Any) -> bool:
            return k % 2 == 0 and alpha == 1

        extra = cmg.generate_gemm_config(VecAMX, [(32, 32, 32), (48, 16, 32), (16, 48, 32)], input_dtype=torch.bfloat16,
                                         output_dtype=torch.float, extra_check=_ok)
        cmg.micro_gemm_configs[cmg.CppMicroBrgemm] += list(extra)
        cmg.micro_gemm_configs[cmg.CppMicroGemmAMX] = [
            c for c in cmg.micro_gemm_configs[cmg.CppMicroGemmAMX] if c.input_dtype != torch.bfloat16]
        cmg.CppMicroBrgemm.get_b_layout = lambda self: cmg.LayoutType.VNNI2  # type: ignore[method-assign]

    @torch.library.custom_op("fidelity_bench::mm_bf16_f32", mutates_args=())
    def mm_bf16_f32(a: torch.Tensor, w: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return cblas_bf16.gemm_bf16_f32(a, w, torch.empty(a.shape[0], w.shape[0]))

    @mm_bf16_f32.register_fake
    def _(a: torch.Tensor, w: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return a.new_empty(a.shape[0], w.shape[0], dtype=torch.float32)

    @lowering.register_lowering(torch.ops.fidelity_bench.mm_bf16_f32.default, type_promotion_kind=None)
    def _lower(a: Any, w: Any, packed: Any) -> Any:
        wt = lowering.lowerings[torch.ops.aten.permute](w, [1, 0])
        _m, _n, _k, layout, mat1, mat2 = mm_args(a, wt, out_dtype=torch.float32)
        size = [int(s) for s in packed.get_size()]

        class Prepacked(CppGemmTemplate):  # type: ignore[misc]
            @classmethod
            def block_weight(cls, W: Any, new_size: Any, padding: Any) -> Any:
                if [int(s) for s in new_size] != size:
                    raise ValueError(f"packed head: expected blocks {list(new_size)}, found {size}")
                return packed

            @classmethod
            def pack_vnni_weight(cls, W: Any, micro_gemm: Any, new_size: Any) -> Any:
                return ir.ExternKernel.require_contiguous(ir.ExternKernel.realize_input(W))

        choices: list[Any] = []
        Prepacked.add_choices(choices, layout, [mat1, mat2])
        node, _ = autotune_select_algorithm("fidelity_bench_mm_bf16_f32", choices, [mat1, mat2], layout)
        return node

    def fn(a: torch.Tensor, w: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.fidelity_bench.mm_bf16_f32(a, w, packed)
        return out

    return torch.compile(fn, dynamic=False, fullgraph=True)


def brgemm_mm(rows: int) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(a, packed [nb, K/2, 64, 2], out) -> out = a @ w.T`` through oneDNN's brgemm ukernel (ctypes)."""
    lib = ctypes.CDLL(_LIB)
    brg, rel = getattr(lib, _BRGEMM), getattr(lib, _RELEASE)
    i64, ptr, b = ctypes.c_int64, ctypes.c_void_p, ctypes.c_bool
    brg.argtypes = [i64, i64, i64, i64, i64, i64, b, ptr, ptr, ptr, b]
    brg.restype = None
    rel.argtypes = [b]
    rel.restype = None

    def run(a: torch.Tensor, packed: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        m, k = a.shape
        nb, bn = packed.shape[0], packed.shape[2]
        lda, ldc = a.stride(0), out.stride(0)
        ap, pp, op = a.data_ptr(), packed.data_ptr(), out.data_ptr()
        for j in range(nb):
            n = min(bn, out.shape[1] - j * bn)
            if n < bn:  # the last block writes a partial tile: through a scratch of full width
                tmp = torch.empty(m, bn)
                run_block(j, tmp.data_ptr(), bn, m, k, lda, ap, pp, packed)
                out[:, j * bn:] = tmp[:, :n]
                continue
            run_block(j, op + 4 * j * bn, ldc, m, k, lda, ap, pp, packed)
        rel(True)
        return out

    def run_block(j: int, c: int, ldc: int, m: int, k: int, lda: int, ap: int, pp: int, packed: torch.Tensor) -> None:
        bn = packed.shape[2]
        for i0 in range(0, m, rows):
            brg(min(rows, m - i0), bn, k, lda, bn, ldc, False, ap + 2 * i0 * lda, pp + 2 * j * packed.stride(0),
                c + 4 * i0 * ldc, True)

    return run


def _bound_ok(got: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> float:
    """Largest |error| / (gamma_K sum |a||w|) of ``got`` [rows, N] against float64; <= 1 is within the bound."""
    k = a.shape[1]
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    a64, worst = a.double(), 0.0
    for c0 in range(0, w.shape[0], 4096):  # vocabulary chunks: a float64 copy of a whole head would not fit
        w64 = w[c0 : c0 + 4096].double()
        err = (got[:, c0 : c0 + 4096].double() - a64 @ w64.T).abs()
        worst = max(worst, float((err / (gamma * (a64.abs() @ w64.abs().T)).clamp_min(1e-300)).max()))
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, default=1024, help="GEMM rows (the scorer's stacked tile: 2 x 512)")
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--vocab", type=int, default=31_040, help="vocabulary slice (1/8 of 248,320)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--arms", default="bare,mkl,inductor,brgemm")
    p.add_argument("--cache-blocking", default=None, help="inductor cpp.gemm_cache_blocking 'Mc,Nc,Kc' (blocks of 32)")
    p.add_argument("--brgemm", action="store_true", help="inductor arm: oneDNN brgemm micro-kernel instead of AMX")
    p.add_argument("--brgemm-rows", type=int, default=256, help="brgemm arm: rows per ukernel call")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.rows, a.hidden, generator=g).bfloat16()
    w = torch.empty(a.vocab, a.hidden, dtype=torch.bfloat16)
    for c0 in range(0, a.vocab, 16384):  # in chunks: an fp32 temporary of the whole head would double the peak
        w[c0 : c0 + 16384] = torch.randn(w[c0 : c0 + 16384].shape, generator=g) * 0.02
    out_b = torch.empty(a.rows, a.vocab, dtype=torch.bfloat16)
    out_f = torch.empty(a.rows, a.vocab)
    steps: dict[str, Callable[[], object]] = {"bare": lambda: torch.mm(x, w.t(), out=out_b),
                                              "mkl": lambda: cblas_bf16.gemm_bf16_f32(x, w, out_f)}
    setup: dict[str, float] = {}
    if "inductor" in arms:
        if a.cache_blocking:
            torch._inductor.config.cpp.gemm_cache_blocking = a.cache_blocking
        t0 = time.perf_counter()
        bn = 16 if a.vocab % 32 and not a.vocab % 16 else 32  # the micro-kernel inductor picks prefers a dividing width
        packed32 = vnni_pack(w, bn).view(-1, a.hidden, bn)
        mm = inductor_mm(a.brgemm)
        with torch.inference_mode():
            mm(x, w, packed32)
        setup["inductor compile + pack s"] = time.perf_counter() - t0
        steps["inductor"] = lambda: mm(x, w, packed32)
    if "brgemm" in arms:
        packed64 = vnni_pack(w, 64)
        bmm = brgemm_mm(a.brgemm_rows)
        steps["brgemm"] = lambda: bmm(x, packed64, out_f)
    names = [n for n in arms if n in steps]
    check: dict[str, float] = {}
    with torch.inference_mode():
        for n in names:
            got = steps[n]()
            if n != "bare":
                res = got if isinstance(got, torch.Tensor) else out_f
                check[n] = _bound_ok(res[:64], x[:64], w)
        cpu: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(a.reps):
            for n in names:
                c0 = time.process_time()
                steps[n]()
                cpu[n].append(time.process_time() - c0)
    print(f"{a.rows} rows x hidden {a.hidden} x vocab {a.vocab}, 1 thread, {a.reps} reps, CPU seconds; "
          f"load average {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores); torch {torch.__version__}")
    for k, v in setup.items():
        print(f"{k}: {v:.1f}")
    for n in names:
        r = [t / b for t, b in zip(cpu[n], cpu["bare"], strict=True)] if "bare" in cpu else [float("nan")]
        err = f"; max error / fp32 bound {check[n]:.2e}" if n in check else ""
        print(f"{n:9s} CPU s {statistics.median(cpu[n]):.3f}  / bare: median {statistics.median(r):.3f} "
              f"({min(r):.3f}-{max(r):.3f}){err}")
    return 0 if all(v <= 1.0 for v in check.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
