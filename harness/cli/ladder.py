"""``fidelity ladder``: a configuration's candidate x shard cases without pytest, serially or on a Ray cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli.registry import Builder, SubParsers, formatter, nonneg_int
from harness.cli.vocabulary import add_config, add_no_score_cache, add_out, add_quiet
from harness.reports.aggregate import format_ladder
from harness.run.cluster.ray_executor import executor_argument
from harness.run.ladder_run import run_ladder
from harness.scoring.backends import device_argument


def add_ladder(sub: SubParsers) -> None:
    p = sub.add_parser(
        "ladder", formatter_class=formatter,
        help="score, gate and report every candidate x shard of a fidelity.toml (serially or on a Ray cluster)",
        description=(
            "The candidate x shard cases of a configuration without pytest: each is captured when needed, scored,\n"
            "gated against its baseline and written as <out>/<candidate>/shard-NN.json + .md, then the\n"
            "ladder (ladder.md, ladder.json) -- the files `pytest CONFIG` writes for the same selection.\n"
            "Exit 0 when every case passed its baseline, 1 when one failed.\n\n"
            "examples:\n"
            "  fidelity ladder fidelity.toml --candidates int8,int4_g32 --shards 0-1\n"
            "  fidelity ladder fidelity.toml --executor ray            # a local Ray cluster for this run\n"
            "  fidelity ladder fidelity.toml --executor ray:auto       # the cluster this machine joined (ray start)"
        ),
    )
    add_config(p, "the fidelity.toml", positional=True, required=True)
    p.add_argument("--executor", type=executor_argument, default="serial", metavar="WHERE",
                   help="serial (default), ray, ray:auto, ray:HOST:PORT or ray://HOST:PORT (needs the ray extra: "
                        "pip install 'fidelity-harness[ray]')")
    p.add_argument("--candidates", default=None, metavar="NAMES", help="candidates, exact names, e.g. int8,int4_g32 (default: all)")
    p.add_argument("--shards", default=None, metavar="SPEC", help="shards, e.g. 0,2-3 (default: all)")
    add_out(p, "report folder: <candidate>/shard-NN.json + .md, ladder.md, ladder.json (default: fidelity-reports/)",
            required=False, default=Path("fidelity-reports"), old=("--report-dir",))
    p.add_argument("--device", type=device_argument, default="auto", help="auto|cpu|cuda[:N] (default: auto)")
    p.add_argument("--window", type=nonneg_int, default=0, metavar="N", help="score_from: drop the first N rows of every context")
    add_no_score_cache(p)
    add_quiet(p)
    p.set_defaults(func=_run)


def _run(a: argparse.Namespace) -> int:
    if not a.quiet and getattr(a, "thread_choice", None) is not None:
        print(f"fidelity: {a.thread_choice.line()}", flush=True)
    out = run_ladder(a.config, report_dir=a.out, executor=a.executor, candidates=a.candidates, shards=a.shards,
                     device=a.device, window=a.window, score_cache=not a.no_score_cache,
                     progress=None if a.quiet else lambda line: print(line, flush=True),
                     command=a.command_line)
    for line in format_ladder(out.rows):
        print(line)
    print(f"reports: {a.out}/")
    if out.nodes:
        print(f"executor: {a.executor}; results from {len(out.nodes)} node(s): {', '.join(out.nodes)}")
    for line in out.reused + out.notes:
        print(line)
    for line in out.skipped:
        print(f"skipped: {line}")
    for line in out.failures:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if out.failures else 0


COMMANDS: tuple[Builder, ...] = (add_ladder,)
