"""Thread count on a busy machine: all cores vs one vs the default (free cores), side by side.

Each arm runs in a fresh child process (thread pools never carry over) with ``FIDELITY_THREADS``
set to the arm's count, or unset for the default (:func:`harness.scoring.threads.apply_default_threads`:
cores minus the one-minute load average). The workload is a main-job unit at the embedded
default's widths: one shard's capture (16 contexts of 256 tokens through the fixture model,
transformers, bf16), its scoring (4,080 positions, hidden 128, vocabulary 4,096, every metric)
and its 10,000-replicate cluster bootstrap, repeated ``--inner`` times. Arms are
interleaved over ``--reps`` repetitions; each figure is the median (min, max) seconds of work
(imports excluded) and the ratio to the default arm.

    python benchmarks/bench_threads.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
from harness.scoring.threads import apply_default_threads
n_threads = apply_default_threads()
from harness.metrics.bootstrap import draw_cluster_weights, ratio_replicates
from harness.scoring.scorer import score_hidden
from harness.engines.transformers import capture_hidden, load_model
from harness.inputs.suite import Suite
model = load_model(sys.argv[1] + "/fixtures/model")
suite = Suite.load(sys.argv[1] + "/fixtures/suite")
g = torch.Generator().manual_seed(0)
n, h, v, inner = 4080, 128, 4096, int(sys.argv[2])
head = (torch.randn(v, h, generator=g) / h**0.5 * 4).bfloat16()
ref = torch.randn(n, h, generator=g).bfloat16()
cand = (ref.float() + 0.05 * torch.randn(n, h, generator=g)).bfloat16()
y = torch.randint(0, v, (n,), generator=g)
clusters = np.repeat(np.arange(47), -(-n // 47))[:n]
t0 = time.perf_counter()
for _ in range(inner):
    for i in range(16):
        capture_hidden(model, suite.tokens[i])
    s = score_hidden(ref, cand, head, y)
    sums = np.bincount(clusters, weights=s.kld)
    counts = np.bincount(clusters).astype(float)
    w = draw_cluster_weights(47, 10_000, seed=0)
    ratio_replicates(w, sums, counts)
print(json.dumps({"threads": n_threads, "seconds": time.perf_counter() - t0}))
"""


def _arm(threads: int | None, inner: int) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env.pop("FIDELITY_THREADS", None)
    if threads is not None:
        env["FIDELITY_THREADS"] = str(threads)
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(inner)], env=env, capture_output=True, text=True,
                         check=True)
    res: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--inner", type=int, default=3, help="workload repetitions inside one child")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    arms: dict[str, int | None] = {"default (free cores)": None, "1 thread": 1, f"{cores} threads (all cores)": cores}
    times: dict[str, list[float]] = {k: [] for k in arms}
    chosen: dict[str, list[int]] = {k: [] for k in arms}
    loads: list[float] = []
    for _ in range(a.reps):
        for name, t in arms.items():
            loads.append(os.getloadavg()[0])
            r = _arm(t, a.inner)
            times[name].append(r["seconds"])
            chosen[name].append(int(r["threads"]))
    base = times["default (free cores)"]
    print(f"{cores} cores; load average during the run {min(loads):.1f}-{max(loads):.1f}; {a.reps} reps x {a.inner} shards")
    fig = {}
    for name, xs in times.items():
        ratio = [x / b for x, b in zip(xs, base, strict=True)]
        fig[name] = {"seconds": xs, "threads": chosen[name], "ratio_to_default": ratio}
        print(f"{name:28s} threads {sorted(set(chosen[name]))}  {statistics.median(xs):6.2f} s ({min(xs):.2f}-{max(xs):.2f})"
              f"  x default {statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})")
    if a.json:
        a.json.write_text(json.dumps({"cores": cores, "loads": loads, "arms": fig}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
