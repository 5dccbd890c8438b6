#!/usr/bin/env python
"""The ladder serially against the same ladder on a local Ray cluster, side by side in one run.

Runs ``pytest CONFIG --fidelity-candidates ... --fidelity-shards ...`` alternately serially and with
``--fidelity-executor ray`` (a local cluster started for the run: one worker per core), each into a
fresh report folder, and prints the wall times of both arms and their ratio, for two kinds of run:

* ``cold``: an empty capture cache before every run, so each case captures its shard (loads the
  candidate's model, runs it) and then scores it -- the work a cluster spreads over machines;
* ``warm``: captures cached, so each case only scores (and the run still starts its cluster).

Every run must pass, and every shard report's ``metrics`` must equal the first serial run's exactly,
so a speed-up never hides lost or different work. The Ray arm's per-task times (each task captures
and scores its own shard; the reports' ``timing.total_s``) and the cluster's fixed cost (its wall time
minus task time / slots) feed the projection to N machines printed at the end (docs/performance.md).

    python benchmarks/bench_ray.py --candidates int8,int4_g32 --shards 0-1 --reps 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def config_copy(tmp: Path, cache: Path) -> Path:
    """fidelity.toml with absolute paths and its capture cache in ``cache``."""
    text = (ROOT / "fidelity.toml").read_text()
    text = text.replace('"fixtures/', f'"{ROOT}/fixtures/').replace('"fidelity_tests/', f'"{ROOT}/fidelity_tests/')
    text = text.replace('cache_dir = ".fidelity-cache"', f'cache_dir = "{cache}"')
    out = tmp / "fidelity.toml"
    out.write_text(text)
    return out


def run(config: Path, report_dir: Path, select: list[str], ray: bool) -> float:
    cmd = [sys.executable, "-m", "pytest", str(config), "-q", "-p", "no:cacheprovider", "-m", "fidelity",
           f"--fidelity-report-dir={report_dir}", *select, *(["--fidelity-executor", "ray"] if ray else [])]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=config.parent, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall


def metrics(report_dir: Path) -> dict[str, object]:
    return {str(p.relative_to(report_dir)): json.loads(p.read_text())["metrics"]
            for p in sorted(report_dir.rglob("shard-*.json"))}


def case_times(report_dir: Path) -> list[float]:
    """Each case's wall time: a Ray task's ``task_s`` (capture included), else the serial case's ``total_s``."""
    out = []
    for p in sorted(report_dir.rglob("shard-*.json")):
        timing = json.loads(p.read_text())["timing"]
        out.append(float(timing.get("task_s", timing["total_s"])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", default="int8,int4_g32")
    ap.add_argument("--shards", default="0-1")
    ap.add_argument("--reps", type=int, default=1, help="interleaved serial/ray pairs per kind (default 1)")
    ap.add_argument("--kinds", default="cold,warm")
    a = ap.parse_args()
    select = ["--fidelity-candidates", a.candidates, "--fidelity-shards", a.shards]
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    cache = tmp / "cache"
    config = config_copy(tmp, cache)
    baseline: dict[str, object] | None = None
    results: dict[str, dict[str, list[float]]] = {}
    cases: dict[str, list[float]] = {}
    try:
        for kind in a.kinds.split(","):
            results[kind] = {"serial": [], "ray": []}
            for rep in range(a.reps):
                for arm in ("serial", "ray") if rep % 2 == 0 else ("ray", "serial"):
                    if kind == "cold":
                        shutil.rmtree(cache, ignore_errors=True)
                    out = tmp / f"{kind}-{arm}-{rep}"
                    wall = run(config, out, select, ray=arm == "ray")
                    found = metrics(out)
                    if baseline is None:
                        baseline = found
                    if found != baseline:
                        raise SystemExit(f"{out}: shard metrics differ from the first run's")
                    results[kind][arm].append(wall)
                    cases[f"{kind}-{arm}"] = case_times(out)
                    print(f"{kind:4s} {arm:6s} rep {rep}: {wall:7.1f} s  ({len(found)} shard reports, metrics equal)",
                          flush=True)
        print()
        print("| run | serial (s) | ray, local cluster (s) | serial / ray |")
        print("|---|---|---|---|")
        for kind, arms in results.items():
            s, r = min(arms["serial"]), min(arms["ray"])
            print(f"| {kind} | {s:.1f} | {r:.1f} | {s / r:.2f}x |")
        if "cold" in results:
            t = cases["cold-ray"]  # each task captured and scored its own shard
            n, slots = len(t), os.cpu_count() or 1
            fixed = min(results["cold"]["ray"]) - sum(t) / min(slots, n)
            mean = sum(t) / n
            print()
            print(f"cold: {n} tasks, {mean:.1f} s each on average (capture + score, 1 thread), {slots} slots; the ray "
                  f"arm's fixed cost (wall - task time / slots) {fixed:.1f} s")
            for machines in (1, 2, 4, 8, 16):
                waves = math.ceil(n / machines)
                print(f"  N = {machines:2d} one-slot machines: {waves} wave(s) x {mean:.1f} s + {fixed:.1f} s "
                      f"= {waves * mean + fixed:.1f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    sys.exit(main())
