#!/usr/bin/env python
"""Scale-out: the main job serially against ``-n W`` pytest-xdist workers, side by side in one run.

Runs ``pytest CONFIG`` (the fidelity cases of a config: every candidate x shard, tails, windows,
pairs) repeatedly, alternating a serial run and a ``-n W --dist loadgroup`` run, each into its own
fresh report folder, and prints the medians (with min/max) of their wall times and the speed-up.
A first serial run fills the capture cache (``settings.cache_dir``), so every timed run scores
cached captures: the comparison is the scoring + statistics work that xdist splits, not the
one-off captures.

Both arms must pass and write the same per-shard metrics as the warm-up run (every number of the
``metrics`` block of every shard report, to a relative 1e-5: thread counts may change a GEMM's
summation order), so a speed-up never hides lost or different work.

Per-worker torch threads are the plugin's own (``harness/scoring/threads.py``: each of W workers
gets ``cores // W``); ``--threads-per-worker`` overrides them through ``FIDELITY_THREADS`` for
comparison (e.g. ``2`` reproduces the oversubscribed set-up: W workers x all cores each).

    python benchmarks/bench_scale_out.py --config fidelity.toml --workers 2 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_job(config: str, report_dir: Path, workers: int, extra: list[str], env: dict[str, str]) -> tuple[float, str]:
    """One ``pytest CONFIG`` run; returns (wall seconds, pytest's last summary line). Fails loudly."""
    cmd = [sys.executable, "-m", "pytest", config, "-q", "-p", "no:cacheprovider",
           f"--fidelity-report-dir={report_dir}", *extra]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "loadgroup"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(f"{' '.join(cmd)}: exit status {proc.returncode}")
    return wall, last


def shard_metrics(report_dir: Path) -> dict[str, object]:
    """``{file name: metrics block}`` of every per-shard JSON report under ``report_dir``."""
    out: dict[str, object] = {}
    for p in sorted(report_dir.glob("*/shard-*.json")):
        try:
            doc = json.loads(p.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and "metrics" in doc:
            out[str(p.relative_to(report_dir))] = doc["metrics"]
    return out


def same(a: object, b: object, rtol: float = 1e-5) -> bool:
    """Nested JSON values equal, numbers to a relative ``rtol``."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rtol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, rtol) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= rtol * max(abs(a), abs(b)) or a == b
    return a == b


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="fidelity.toml", help="the fidelity.toml to run (default: the embedded default)")
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers of the parallel arm (default 2)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions of each arm, interleaved (default 3)")
    ap.add_argument("--threads-per-worker", type=int, default=None,
                    help="force FIDELITY_THREADS in the parallel arm (default: the plugin's cores // workers)")
    ap.add_argument("-k", dest="keyword", default=None, help="pytest -k expression to time a subset")
    args = ap.parse_args(argv)
    if args.workers < 2 or args.reps < 1:
        ap.error("--workers must be >= 2 and --reps >= 1")

    extra = ["-k", args.keyword] if args.keyword else []
    base_env = {k: v for k, v in os.environ.items() if k not in ("FIDELITY_THREADS", "OMP_NUM_THREADS")}
    par_env = dict(base_env)
    if args.threads_per_worker is not None:
        par_env["FIDELITY_THREADS"] = str(args.threads_per_worker)

    from harness.scoring.threads import available_cores, threads_per_worker

    cores = available_cores()
    tpw = args.threads_per_worker or threads_per_worker(args.workers, cores)
    print(f"config {args.config}; {cores} cores; serial: {cores} torch threads; "
          f"-n {args.workers}: {tpw} thread(s) per worker; load average at start {loadavg()}", flush=True)

    serial: list[float] = []
    parallel: list[float] = []
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        t = Path(tmp)
        wall, last = run_job(args.config, t / "warm", 1, extra, base_env)
        print(f"warm-up (fills the capture cache): {wall:.1f} s  [{last}]", flush=True)
        reference_metrics = shard_metrics(t / "warm")
        for rep in range(args.reps):
            for arm, workers, env, times in (("serial", 1, base_env, serial),
                                              (f"-n {args.workers}", args.workers, par_env, parallel)):
                d = t / f"{arm.replace(' ', '')}-{rep}"
                wall, last = run_job(args.config, d, workers, extra, env)
                got = shard_metrics(d)
                if not same(got, reference_metrics):
                    raise SystemExit(f"{arm} rep {rep}: per-shard metrics differ from the serial warm-up run "
                                     f"({len(got)} vs {len(reference_metrics)} shard reports)")
                times.append(wall)
                print(f"rep {rep} {arm:>6}: {wall:7.1f} s  [{last}]  load {loadavg()}", flush=True)

    ms, mp = statistics.median(serial), statistics.median(parallel)
    print()
    print(f"| arm | median wall (min-max), {args.reps} reps |")
    print("|---|---|")
    print(f"| serial ({cores} threads) | {ms:.1f} s ({min(serial):.1f}-{max(serial):.1f}) |")
    print(f"| -n {args.workers} ({tpw} thread(s) each) | {mp:.1f} s ({min(parallel):.1f}-{max(parallel):.1f}) |")
    print(f"| speed-up serial / -n {args.workers} | {ms / mp:.2f}x |")
    print(f"{len(reference_metrics)} shard reports agree in every run; load average at end {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
