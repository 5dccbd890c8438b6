"""bf16 where it is native and where it is emulated: the GEMMs and the embedded model's capture, side by side.

Every arm runs in a fresh child process (oneDNN reads its ISA limit once) with one torch thread, timed in the
process's CPU seconds (one thread: the work, not the scheduler of a shared machine):

* ``gemm``: square matmuls (512, 1,024) in bf16 and in fp32, GFLOP/s and their ratio, and oneDNN's own
  word on which bf16 kernel ran (``ONEDNN_VERBOSE``: ``brg_matmul:avx512_core_bf16`` / ``...amx`` or none: torch's
  emulated fallback);
* ``capture``: the embedded model (fixtures/model, bf16) capturing ``--contexts`` suite contexts on each path of
  :mod:`harness.engines.bf16_path`: ``native`` (bf16 kernels), ``fp32`` with weights widened once and held
  (``held``), ``fp32`` widening each weight when it is used (``per-layer``); seconds per context, the ratio to
  the native arm of the same machine kind, and the ratio to the GEMM the machine has: the capture's matmul FLOPs
  (counted by ``torch.utils.flop_counter``) at the faster of the two 1,024^2 GEMMs measured in the same run.

Machine kinds: this CPU as it is, and with ``ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
ATEN_CPU_CAPABILITY=avx2`` (oneDNN, MKL and ATen held to AVX2: the GEMMs of an AVX2-only CPU, bf16 emulated;
checked by the verbose line; torch's fp32 GEMM is MKL's sgemm, which the oneDNN limit does not reach). Rows: float64
check of every fp32-path capture against the native one of the same kind -- the largest difference in units of
bf16 spacing at the native value (``ulp``), and the share of elements that differ at all -- next to the
native capture's own distance from a float64 forward of the same bf16 weights (the bf16 rounding itself).

    nice python benchmarks/bench_bf16_path.py --contexts 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GEMM = r"""
import json, os, subprocess, sys, time, torch
torch.set_num_threads(1)
out = {"capability": str(torch.backends.cpu.get_cpu_capability())}
for n in (512, 1024):
    a, b = torch.randn(n, n), torch.randn(n, n)
    for name, (x, y) in {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16())}.items():
        x @ y
        best, t_end = 1e9, time.process_time() + 3
        while time.process_time() < t_end or best == 1e9:
            t = time.process_time(); x @ y; best = min(best, time.process_time() - t)
        out[f"{name}_{n}"] = 2 * n ** 3 / best / 1e9
probe = subprocess.run([sys.executable, "-c", "import torch; torch.set_num_threads(1); a = torch.ones(64, 64).bfloat16(); a @ a"],
                       env={**os.environ, "ONEDNN_VERBOSE": "1"}, capture_output=True, text=True).stdout
ran = [f for ln in probe.splitlines() if ",exec,cpu,matmul," in ln for f in ln.split(",") if "matmul:" in f]
out["bf16_kernel"] = ran[0] if ran else "none (torch's emulated fallback)"
print(json.dumps(out))
"""

CAPTURE = r"""
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
torch.set_num_threads(1)
from harness.engines.bf16_path import Fp32Kernels, widen_weights
from harness.engines.transformers import capture_hidden, load_model
from harness.inputs.suite import Suite
arm, n, out_path = sys.argv[2], int(sys.argv[3]), sys.argv[4]
model = load_model(sys.argv[1] + "/fixtures/model")
suite = Suite.load(sys.argv[1] + "/fixtures/suite")
mode = None if arm == "native" else Fp32Kernels(widen_weights(model) if arm == "fp32-held" else None)
def run(i):
    if mode is None:
        return capture_hidden(model, suite.tokens[i])
    with mode.mode:
        return capture_hidden(model, suite.tokens[i])
run(0)
t0 = time.process_time()
rows = [run(i) for i in range(n)]
dt = (time.process_time() - t0) / n
torch.save(torch.stack(rows), out_path)
if arm == "native":  # the same bf16 weights in float64 (no rounding between operations)
    m64 = model.double()
    from harness.engines.transformers import head_inputs
    ids = torch.as_tensor(suite.tokens[:n].astype("int64"))
    torch.save(head_inputs(m64, ids, stop=False)[:, :-1].contiguous(), out_path + ".f64")
from torch.utils.flop_counter import FlopCounterMode
counter = FlopCounterMode(display=False)
with counter:
    run(0)
print(json.dumps({"s_per_context": dt, "flops_per_context": counter.get_total_flops()}))
"""

AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def _child(code: str, args: list[str], env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    doc: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def _ulps(x, ref):  # type: ignore[no-untyped-def]
    """|x - ref| in units of bf16 spacing (2^-7 relative) at max(|ref|, the row's RMS / 16), in float64: an
    element near zero is measured at its row's scale, where a rounding of its inputs moves it."""
    import torch

    r = ref.double()
    scale = torch.maximum(r.abs(), r.pow(2).mean(dim=-1, keepdim=True).sqrt() / 16)
    spacing = torch.exp2(torch.floor(torch.log2(scale)) - 7)
    return (x.double() - r).abs() / spacing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, default=4)
    args = ap.parse_args()
    import tempfile

    import torch

    from harness.engines.bf16_path import cpu_bf16_flags

    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, bf16 flags {list(cpu_bf16_flags()) or 'none'}; "
          f"torch {torch.__version__}; 1 thread per arm, CPU seconds")
    for kind, env in (("this CPU", {}), ("held to AVX2", AVX2)):
        g = _child(GEMM, [], env)
        print(f"\n[{kind}] ATen capability {g['capability']}; bf16 GEMM kernel: {g['bf16_kernel']}")
        for n in (512, 1024):
            b, f = float(g[f"bf16_{n}"]), float(g[f"fp32_{n}"])  # type: ignore[arg-type]
            print(f"  GEMM {n}^2: bf16 {b:7.2f} GFLOP/s, fp32 {f:7.2f} GFLOP/s, bf16/fp32 {b / f:6.3f}")
        with tempfile.TemporaryDirectory() as tmp:
            rows: dict[str, torch.Tensor] = {}
            times: dict[str, float] = {}
            flops: dict[str, float] = {}
            for arm in ("native", "fp32-held", "fp32-per-layer"):
                out = str(Path(tmp) / f"{arm}.pt")
                res = _child(CAPTURE, [str(ROOT), arm, str(args.contexts), out], env)
                times[arm], flops[arm] = float(res["s_per_context"]), float(res["flops_per_context"])  # type: ignore[arg-type]
                rows[arm] = torch.load(out)
            f64 = torch.load(str(Path(tmp) / "native.pt.f64"))
        u64 = _ulps(rows["native"], f64)
        print(f"  native capture vs float64 forward: max {float(u64.max()):.1f} bf16 ulp, mean {float(u64.mean()):.3f}, "
              f"median {float(u64.median()):.2f}")
        best = max(float(g["bf16_1024"]), float(g["fp32_1024"]))  # type: ignore[arg-type]
        which = "bf16" if float(g["bf16_1024"]) > float(g["fp32_1024"]) else "fp32"  # type: ignore[arg-type]
        for arm in times:
            at_gemm = flops[arm] / (best * 1e9)  # seconds the capture's matmuls take at the machine's GEMM rate
            line = (f"  capture {arm:<15} {times[arm]:.4f} s/context, {times[arm] / times['native']:.3f}x native, "
                    f"{times[arm] / at_gemm:.1f}x its {flops[arm] / 1e9:.3f} GFLOP at the machine's GEMM ({which} 1,024^2)")
            if arm != "native":
                u = _ulps(rows[arm], rows["native"])
                uf = _ulps(rows[arm], f64)
                line += (f"\n      vs native: max {float(u.max()):.1f} ulp, {float((u > 0).double().mean()) * 100:.1f}% of "
                         f"elements differ; vs float64: max {float(uf.max()):.1f} ulp, mean {float(uf.mean()):.3f}, "
                         f"median {float(uf.median()):.2f}")
            print(line)


if __name__ == "__main__":
    main()
