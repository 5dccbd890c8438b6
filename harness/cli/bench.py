"""``fidelity bench``: scorer performance on one shape and device, side by side in one run.

Registered through :func:`harness.cli.main.command`; torch is imported inside the handler.
See :mod:`harness.scoring.bench` for what is measured and how the projection is made.
"""

from __future__ import annotations

import argparse
import json

from harness.cli.registry import Builder, SubParsers, formatter, positive_int
from harness.errors import UsageError


def _bench(a: argparse.Namespace) -> int:
    from harness.scoring.bench import SHAPES, format_bench, run_bench

    n, h, v = SHAPES[a.shape]
    n = a.positions or n
    h = a.hidden or h
    v = a.vocab or v
    if a.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {a.device}: CUDA is not available on this machine (torch {torch.__version__})")
    r = run_bench(n, h, v, device=a.device, backend=a.backend, threads=a.threads, tile_rows=a.tile_rows, reps=a.reps,
                  memory=not a.skip_memory, two_pass=not a.skip_two_pass)
    for line in format_bench(r):
        print(line)
    if a.json:
        print(json.dumps(r.to_dict()))
    return 0


def add_bench(sub: SubParsers) -> None:
    p = sub.add_parser(
        "bench", help="scorer throughput: ratios to bare GEMMs and two-pass, positions/s, memory, projection",
        formatter_class=formatter,
        description=(
            "Time the exact scorer, the two bare GEMMs (fp32 logits on the scorer's GEMM path, plain\n"
            "fp32, and bf16 logits for reference) and the two-pass method side by side (median, min\n"
            "and max of interleaved reps), report the ratios, the metric pass's share,\n"
            "positions/s, peak extra memory at N and 4N positions (fresh child processes) and the\n"
            "projected time for one candidate of the seed suite (10,480,640 positions through a\n"
            "[248320, 5120] head), scaled from this run by FLOPs.\n\n"
            "examples:\n"
            "  fidelity bench                          # 2048 x [65536, 2048]: ~10 min on 2 CPU cores\n"
            "  fidelity bench --shape small            # 1024 x [16384, 512], < 1 min\n"
            "  fidelity bench --shape qwen --device cuda"
        ),
    )
    p.add_argument("--shape", choices=["default", "small", "scaled", "qwen"], default="default",
                   help="default: 2048 x [65536, 2048] (Qwen-proportioned); small: 1024 x [16384, 512]; "
                        "scaled: 4096 x [65536, 2048]; qwen: 65536 x [248320, 5120] (GPU)")
    p.add_argument("--positions", type=positive_int, default=None, help="override the shape's positions")
    p.add_argument("--hidden", type=positive_int, default=None, help="override the shape's hidden size")
    p.add_argument("--vocab", type=positive_int, default=None, help="override the shape's vocab")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--backend", choices=["auto", "torch", "triton"], default=None, help="scorer backend (default auto)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--tile-rows", type=positive_int, default=None, dest="tile_rows", help="torch path tile rows")
    p.add_argument("--reps", type=positive_int, default=3, help="interleaved repetitions (median, min and max are reported)")
    p.add_argument("--skip-memory", action="store_true", dest="skip_memory", help="skip the N / 4N memory children")
    p.add_argument("--skip-two-pass", action="store_true", dest="skip_two_pass", help="skip the two-pass method")
    p.add_argument("--json", action="store_true", help="also print the raw figures as one JSON line")
    p.set_defaults(func=_bench)


#: Parser builders, in help order.
COMMANDS: tuple[Builder, ...] = (add_bench,)
