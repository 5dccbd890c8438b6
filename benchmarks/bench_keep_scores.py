"""Store-then-score vs score-while-capturing (``keep = "scores"``), per candidate, side by side in one run.

For each mode a fresh child process loads the configuration (``--config``), points its ``cache_dir`` at a new
empty folder, sets the candidate's ``keep`` and scores ``--shards`` of ``--candidate`` through the session (the
path pytest and ``fidelity ladder`` take: capture and score, or both at once). Each child reports its wall seconds,
the bytes it wrote (``write_bytes`` of ``/proc/self/io``: everything, temporaries and rewritten manifests
included), the bytes left in the cache (capture store vs scores) and its peak resident memory; the parent prints
both rows, the ratios, and whether the per-position scores of the two modes are identical (sha256 of every score
array). At other widths point ``--config`` at a configuration of those models (the function each child runs,
:func:`measure`, takes the configuration and the candidate).

    python benchmarks/bench_keep_scores.py --candidate int8 --shards 0
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _written() -> int:
    """Bytes this process has caused to be written to storage so far (Linux ``/proc/self/io``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no write_bytes")


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def measure(config_path: Path, candidate: str, shards: list[int], keep: str, cache_dir: Path,
            device: str = "cpu") -> dict[str, Any]:
    """Score ``candidate`` x ``shards`` of the configuration with ``keep`` into the empty ``cache_dir``."""
    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession

    config = load_config(config_path)
    cand = dataclasses.replace(config.candidate(candidate), keep=keep)
    config = dataclasses.replace(config, cache_dir=cache_dir, candidates=(cand,), pairs=())
    session = FidelitySession(config, device=device)
    _ = session.reference, session.head  # the reference is read in both modes: not timed
    digest = hashlib.sha256()
    n = 0
    session.plan([(candidate, s) for s in shards])
    w0, t0 = _written(), time.perf_counter()
    for shard in shards:
        pos = session.positions(cand, shard)
        n += len(pos.row)
        for name, arr in sorted(pos.scores.to_dict().items()):
            digest.update(name.encode() + arr.tobytes())
    wall = time.perf_counter() - t0
    written = _written() - w0
    return {"keep": keep, "wall_s": wall, "written_bytes": written,
            "kept_captures_bytes": _folder_bytes(cache_dir / "captures"),
            "kept_scores_bytes": _folder_bytes(cache_dir / "scores"),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "positions": n, "scores_sha256": digest.hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "fidelity.toml")
    ap.add_argument("--candidate", default="int8")
    ap.add_argument("--shards", default="0", help="e.g. 0 or 0,1")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--child", choices=("store", "scores"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    shards = [int(s) for s in a.shards.split(",")]
    if a.child:
        with tempfile.TemporaryDirectory(prefix="bench-keep-") as tmp:
            row = measure(a.config.resolve(), a.candidate, shards, a.child, Path(tmp) / "cache", a.device)
        print(json.dumps(row))
        return
    import torch

    from harness.scoring.torch_path import gemm_path

    bf16 = torch.empty(1, 1, dtype=torch.bfloat16)

    rows = []
    for keep in ("store", "scores"):
        out = subprocess.run([sys.executable, __file__, "--child", keep, "--config", str(a.config), "--candidate",
                              a.candidate, "--shards", a.shards, "--device", a.device],
                             capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
          f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"scorer GEMM {gemm_path(torch.device('cpu'), bf16, bf16)}")
    print(f"candidate {a.candidate}, shards {a.shards}, {rows[0]['positions']} positions")
    print("| keep | wall s | written MB | kept: captures MB | kept: scores MB | peak RSS MiB |")
    print("|------|-------:|-----------:|------------------:|----------------:|-------------:|")
    for r in rows:
        print(f"| {r['keep']} | {r['wall_s']:.2f} | {r['written_bytes'] / 1e6:.2f} | {r['kept_captures_bytes'] / 1e6:.2f} "
              f"| {r['kept_scores_bytes'] / 1e6:.2f} | {r['peak_rss_mib']:.0f} |")
    s, c = rows
    print(f"scores / store: wall {c['wall_s'] / s['wall_s']:.3f}, written {c['written_bytes'] / max(1, s['written_bytes']):.3f}")
    print(f"per-position scores identical: {s['scores_sha256'] == c['scores_sha256']}")


if __name__ == "__main__":
    main()
