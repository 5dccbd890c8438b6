"""The main job cold vs rerun, side by side in one run: what a rerun of an unchanged ladder costs.

Three runs of ``pytest fidelity.toml`` (or ``--config``) in fresh child processes, on a copy of the
configuration whose ``cache_dir`` is a new empty folder (every other path made absolute):

* ``cold``: nothing cached (every live candidate captured, every candidate x shard scored);
* ``captures cached``: the scores cache removed, the captures kept (what a rerun cost before scores were cached);
* ``rerun``: everything cached (positions read from ``<cache_dir>/scores/``).

Each arm's wall and CPU seconds (user + system of the child) and its ratio to ``cold``; the numbers are
identical when every shard report's ``metrics`` block of each arm equals cold's (checked, printed), and the
run-level files (``ladder.json``, ``window.json``, ``tails.json``, ``tails.png``, paired) are compared byte for
byte. Goal: rerun <= 15 % of cold. ``--candidates`` narrows the ladder (pytest's ``--fidelity-candidates``).

Python's bytecode cache is on in every child (``PYTHONDONTWRITEBYTECODE`` removed, as an installed package has
its ``.pyc`` files) and primed by one ``--collect-only`` run before the arms, so no arm pays compiling the harness
(and pytest's assertion rewriting of it) that the others do not. The load average is printed before each arm.

    python benchmarks/bench_rerun.py --candidates int8,int4_g32,int4_g32_b,nvfp4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_PATH_KEYS = re.compile(r'^(\s*(?:path|model|store|head|baselines|suite|dataset)\s*=\s*")([^"]+)(")', re.M)
_CACHE = re.compile(r'^(\s*cache_dir\s*=\s*")([^"]+)(")', re.M)


def absolute_config(src: Path, dst: Path, cache_dir: Path) -> None:
    """``src`` written to ``dst`` with every path absolute and ``cache_dir`` set to ``cache_dir``."""
    text = _PATH_KEYS.sub(lambda m: m.group(1) + str((src.parent / m.group(2)).resolve()) + m.group(3), src.read_text())
    text = _CACHE.sub(lambda m: m.group(1) + str(cache_dir) + m.group(3), text)
    if not _CACHE.search(text):
        text = text.replace("[settings]", f'[settings]\ncache_dir = "{cache_dir}"', 1)
    dst.write_text(text)


#: The run-level files compared byte for byte between arms (besides every shard report's metrics block).
_RUN_FILES = ("ladder.json", "window.json", "tails.json", "tails.png", "precision_floor.json")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT)}


@dataclass
class Arm:
    """One arm's measurement: seconds, exit status, every shard report's metrics, the run-level files' bytes."""

    wall_s: float
    cpu_s: float
    rc: int
    metrics: dict[str, object]
    files: dict[str, bytes]
    reused: list[str]
    tail: str


def run_arm(config: Path, reports: Path, candidates: str | None, extra: list[str], name: str) -> Arm:
    """One ``pytest`` run in a child process: wall and CPU seconds, exit status, the shard reports' metrics."""
    shutil.rmtree(reports, ignore_errors=True)
    cmd = [sys.executable, "-m", "pytest", str(config), "-q", "-p", "no:cacheprovider", "-W", "ignore",
           f"--fidelity-report-dir={reports}", *extra]
    if candidates:
        cmd.append(f"--fidelity-candidates={candidates}")
    print(f"{name}: load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=config.parent, capture_output=True, text=True, env=_env())
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    metrics = {str(p.relative_to(reports)): json.loads(p.read_text())["metrics"]
               for p in sorted(reports.rglob("*.json")) if _is_shard_report(p)}
    files = {str(p.relative_to(reports)): p.read_bytes() for p in sorted(reports.rglob("*"))
             if p.name in _RUN_FILES or p.parent.name == "paired"}
    reused = [ln for ln in proc.stdout.splitlines() if re.match(r"(score|summary|result|capture) cache:", ln)]
    return Arm(wall, cpu, proc.returncode, metrics, files, reused, proc.stdout[-800:] + proc.stderr[-800:])


def _is_shard_report(path: Path) -> bool:
    try:
        doc = json.loads(path.read_text())
    except (ValueError, OSError):
        return False
    return isinstance(doc, dict) and "metrics" in doc and "comparability" in doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "fidelity.toml")
    ap.add_argument("--candidates", default=None, help="comma-separated candidate names (default: all)")
    ap.add_argument("--pytest-args", default="", help="more pytest arguments, e.g. '-n 2'")
    args = ap.parse_args()
    import platform

    import torch

    from harness.scoring.gemm import choose_gemm

    gemm = choose_gemm(torch.device("cpu"), (torch.bfloat16, torch.bfloat16), False)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"torch {torch.__version__} CPU capability {torch.backends.cpu.get_cpu_capability()}; scorer GEMM {gemm}")
    with tempfile.TemporaryDirectory(prefix="bench-rerun-") as tmp:
        work = Path(tmp)
        cache = work / "cache"
        config = work / "fidelity.toml"
        absolute_config(args.config.resolve(), config, cache)
        extra = args.pytest_args.split()
        # prime Python's bytecode cache (the harness, pytest's rewritten plugin modules): no arm pays it alone
        subprocess.run([sys.executable, "-m", "pytest", str(config), "-q", "-p", "no:cacheprovider", "--collect-only",
                        f"--fidelity-report-dir={work / 'reports-prime'}"], cwd=config.parent, capture_output=True,
                       env=_env(), check=False)
        arms: dict[str, Arm] = {}
        arms["cold"] = run_arm(config, work / "reports-cold", args.candidates, extra, "cold")
        for kept in ("scores", "summaries", "results"):  # what a rerun cost before results were cached
            shutil.rmtree(cache / kept, ignore_errors=True)
        arms["captures cached"] = run_arm(config, work / "reports-captured", args.candidates, extra, "captures cached")
        arms["rerun"] = run_arm(config, work / "reports-rerun", args.candidates, extra, "rerun")
    cold = arms["cold"]
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'arm':<16} {'wall s':>8} {'CPU s':>8} {'wall/cold':>9} {'CPU/cold':>9}  rc  metrics == cold's; run files == cold's")
    for name, a in arms.items():
        same = a.metrics == cold.metrics and bool(cold.metrics)
        differ = sorted(k for k in {*a.files, *cold.files} if a.files.get(k) != cold.files.get(k))
        print(f"{name:<16} {a.wall_s:8.1f} {a.cpu_s:8.1f} {a.wall_s / cold.wall_s:9.3f} {a.cpu_s / cold.cpu_s:9.3f}  "
              f"{a.rc:>2}  {same} ({len(a.metrics)} shard reports); {not differ and bool(cold.files)} "
              f"({len(a.files)} files{'; differ: ' + ', '.join(differ) if differ else ''})")
        for line in a.reused:
            print(f"{'':<16} {line}")
        if a.rc != 0:
            print(a.tail)


if __name__ == "__main__":
    main()
