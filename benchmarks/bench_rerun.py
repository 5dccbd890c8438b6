"""The main job cold vs rerun, side by side in one run: what a rerun of an unchanged ladder costs.

Three runs of ``pytest fidelity.toml`` (or ``--config``) in fresh child processes, on a copy of the
configuration whose ``cache_dir`` is a new empty folder (every other path made absolute):

* ``cold``: nothing cached (every live candidate captured, every candidate x shard scored);
* ``captures cached``: the scores cache removed, the captures kept (what a rerun cost before scores were cached);
* ``rerun``: everything cached (positions read from ``<cache_dir>/scores/``).

Each arm's wall and CPU seconds (user + system of the child) and its ratio to ``cold``; the numbers are
identical when every shard report's ``metrics`` block of each arm equals cold's (checked, printed). Goal:
rerun <= 15 % of cold. ``--candidates`` narrows the ladder (pytest's ``--fidelity-candidates``).

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


def run_arm(config: Path, reports: Path, candidates: str | None, extra: list[str]) -> dict[str, object]:
    """One ``pytest`` run in a child process: wall and CPU seconds, exit status, the shard reports' metrics."""
    shutil.rmtree(reports, ignore_errors=True)
    cmd = [sys.executable, "-m", "pytest", str(config), "-q", "-p", "no:cacheprovider", "-W", "ignore",
           f"--fidelity-report-dir={reports}", *extra]
    if candidates:
        cmd.append(f"--fidelity-candidates={candidates}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=config.parent, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    metrics = {str(p.relative_to(reports)): json.loads(p.read_text())["metrics"]
               for p in sorted(reports.rglob("*.json")) if _is_shard_report(p)}
    reused = [ln for ln in proc.stdout.splitlines() if ln.startswith("score cache:")]
    return {"wall_s": wall, "cpu_s": cpu, "rc": proc.returncode, "metrics": metrics,
            "reused": reused[0] if reused else "", "tail": proc.stdout[-800:] + proc.stderr[-800:]}


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

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"torch {torch.__version__} CPU capability {torch.backends.cpu.get_cpu_capability()}")
    with tempfile.TemporaryDirectory(prefix="bench-rerun-") as tmp:
        work = Path(tmp)
        cache = work / "cache"
        config = work / "fidelity.toml"
        absolute_config(args.config.resolve(), config, cache)
        extra = args.pytest_args.split()
        arms: dict[str, dict[str, object]] = {}
        arms["cold"] = run_arm(config, work / "reports-cold", args.candidates, extra)
        shutil.rmtree(cache / "scores", ignore_errors=True)
        arms["captures cached"] = run_arm(config, work / "reports-captured", args.candidates, extra)
        arms["rerun"] = run_arm(config, work / "reports-rerun", args.candidates, extra)
    cold = arms["cold"]
    print(f"{'arm':<16} {'wall s':>8} {'CPU s':>8} {'wall/cold':>9} {'CPU/cold':>9}  rc  metrics == cold's")
    for name, a in arms.items():
        same = a["metrics"] == cold["metrics"] and bool(cold["metrics"])
        print(f"{name:<16} {a['wall_s']:8.1f} {a['cpu_s']:8.1f} {a['wall_s'] / cold['wall_s']:9.3f} "  # type: ignore[operator]
              f"{a['cpu_s'] / cold['cpu_s']:9.3f}  {a['rc']:>2}  {same} ({len(a['metrics'])} shard reports)")  # type: ignore[operator, arg-type]
        if a["reused"]:
            print(f"{'':<16} {a['reused']}")
        if a["rc"] not in (0,):
            print(a["tail"])


if __name__ == "__main__":
    main()
