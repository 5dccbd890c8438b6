"""Batched capture vs one context per engine call, side by side: throughput and the stored rows.

For each engine (transformers; vLLM when installed) the fixture model captures the same shard
twice per repetition, once with ``batch_size = 1`` and once with ``batch_size = --batch``
(``[candidates.options]``), into fresh stores; arms are interleaved. Reported: contexts per
second of each arm (median, min, max) and their ratio, and the largest difference between the
two stores' rows (absolute, and relative to the row's largest value), which is 0 when the
engine's kernels do not depend on the batch shape.

    python benchmarks/bench_batched_capture.py --reps 2 --batch 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.capture.loop import capture  # noqa: E402
from harness.engines.base import EngineOptions  # noqa: E402
from harness.engines.registry import get_engine  # noqa: E402


def _run(engine: str, batch: int, shards: list[int], out: Path) -> tuple[float, object]:
    opts = EngineOptions(engine_options={"batch_size": batch} if batch > 1 else {})
    t0 = time.perf_counter()
    store = capture(engine, ROOT / "fixtures" / "model", ROOT / "fixtures" / "suite", out, shards=shards, options=opts,
                    progress=False)
    return time.perf_counter() - t0, store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--shards", default="0", help="comma-separated shards of fixtures/suite (16 contexts each)")
    p.add_argument("--engines", default="transformers,vllm")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    shards = [int(s) for s in a.shards.split(",")]
    result: dict[str, object] = {}
    for engine in a.engines.split(","):
        if not get_engine(engine).available():
            print(f"{engine}: not installed, skipped")
            continue
        t1: list[float] = []
        tb: list[float] = []
        worst_abs = worst_rel = 0.0
        n = 0
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(a.reps):
                d1, s1 = _run(engine, 1, shards, Path(tmp) / f"one{r}")
                db, sb = _run(engine, a.batch, shards, Path(tmp) / f"many{r}")
                t1.append(d1)
                tb.append(db)
                for i in s1.indices:  # type: ignore[attr-defined]
                    x, y = s1.load(i).double(), sb.load(i).double()  # type: ignore[attr-defined]
                    worst_abs = max(worst_abs, float((x - y).abs().max()))
                    worst_rel = max(worst_rel, float(((x - y).abs().amax(1) / x.abs().amax(1)).max()))
                n = len(s1.indices)  # type: ignore[attr-defined]
        ratio = [x / y for x, y in zip(t1, tb, strict=True)]
        result[engine] = {"contexts": n, "batch": a.batch, "one_at_a_time_s": t1, "batched_s": tb,
                          "speedup": ratio, "max_abs_diff": worst_abs, "max_rel_diff": worst_rel}
        print(f"{engine}: {n} contexts; one at a time {n / statistics.median(t1):.2f} ctx/s "
              f"({statistics.median(t1):.2f} s), batch {a.batch} {n / statistics.median(tb):.2f} ctx/s "
              f"({statistics.median(tb):.2f} s); speed-up {statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f}); "
              f"rows: max |diff| {worst_abs:.3g}, relative to the row's max {worst_rel:.3g}")
    if a.json:
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
