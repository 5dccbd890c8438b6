"""``fidelity dataset build``: package a project's inputs and reports as a relocatable dataset."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.capture.store import CaptureStore
from harness.cli.registry import Builder, SubParsers, formatter
from harness.cli.vocabulary import add_config
from harness.dataset.build import build_dataset, size_lines
from harness.errors import UsageError
from harness.inputs.config import load_config
from harness.inputs.suite import Suite
from harness.interchange.writer import write_published
from harness.reports.shard import ShardReport


def _build(a: argparse.Namespace) -> int:
    doc = build_dataset(config_path=a.config, reports_dir=a.reports, corpus=a.corpus, tokenizer=a.tokenizer,
                        reference_shards=a.reference_shards, out=a.out)
    print(f"{a.out}: dataset written; sizes per part:")
    for line in size_lines(doc):
        print(line)
    print(f"check it with: fidelity publish verify {a.out}")
    return 0


def _write_published(a: argparse.Namespace) -> int:
    cfg = load_config(a.config)
    suite = Suite.load(cfg.suite, verify=True)
    reference = CaptureStore.open(cfg.reference.store, suite, verify=True)
    shards = suite.parse_shards(a.reference_shards)
    captures = {}
    for spec in a.capture:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--capture: expected NAME=STORE, found {spec!r}")
        captures[name] = CaptureStore.open(Path(path), suite, verify=True)
    reports: dict[str, list[ShardReport]] = {}
    if a.reports is not None:
        for p in sorted(a.reports.glob("*/shard-*.json")):
            rep = ShardReport.load(p)
            reports.setdefault(p.parent.name, []).append(rep)
    write_published(a.out, suite=suite, reference=reference, head=cfg.reference.head, reference_shards=shards,
                    candidates=captures, reports=reports)
    print(f"{a.out}: written in the published fidelity-suite layout (suite/, reference/, captures/, reports/, lm-head/)")
    return 0


def add_dataset(sub: SubParsers) -> None:
    p = sub.add_parser("dataset", help="build a relocatable reference dataset, or write the published layout", formatter_class=formatter)
    ss = p.add_subparsers(dest="dataset_cmd", required=True, metavar="{build,write-published}")
    b = ss.add_parser("build", help="suite, shard views, reference shards, head, corpus, reports, protocol, card, checksums",
                      formatter_class=formatter,
                      description=("Write one folder (relative paths only) that a stranger can verify and score a\n"
                                   "candidate against without the BF16 model; prints the size of each part and the\n"
                                   "projection at the seed scale.\n\nexample:\n"
                                   "  fidelity dataset build --config fidelity.toml --reports fidelity-reports \\\n"
                                   "      --corpus fixtures/corpus --tokenizer fixtures/model/tokenizer.json \\\n"
                                   "      --reference-shards 0 --out dataset/"))
    add_config(b, "fidelity.toml (suite, reference, head; default: fidelity.toml)", default=Path("fidelity.toml"))
    b.add_argument("--reports", type=Path, default=None,
                   help="report folder of a run (shard-*.json) to include; without it, a reference-only dataset")
    b.add_argument("--corpus", required=True, type=Path, help="folder holding the suite's documents")
    b.add_argument("--tokenizer", required=True, type=Path, help="the suite's tokenizer.json")
    b.add_argument("--reference-shards", default="0", dest="reference_shards", help="shards whose reference is included (default 0)")
    b.add_argument("--out", required=True, type=Path, help="new or empty output folder")
    b.set_defaults(func=_build)
    w = ss.add_parser("write-published", help="write suite, reference, captures and reports in the published fidelity-suite layout",
                      formatter_class=formatter,
                      description=("Write this project's suite (one JSON token file per context, shard views), the\n"
                                   "reference shards, candidate capture stores and shard reports (as\n"
                                   "qwen38-fidelity-report/2, or /3 for a window) in the published layout, which that\n"
                                   "layout's own replay and kld_aggregate tools read.\n\nexample:\n"
                                   "  fidelity dataset write-published --config fidelity.toml --reference-shards 0 \\\n"
                                   "      --capture int8=captures/int8 --reports fidelity-reports --out published-layout/"))
    add_config(w, "fidelity.toml (suite, reference, head; default: fidelity.toml)", default=Path("fidelity.toml"))
    w.add_argument("--reference-shards", default="0", dest="reference_shards", help="shards whose reference is written (default 0)")
    w.add_argument("--capture", action="append", default=[], metavar="NAME=STORE", help="a candidate capture store to include (repeatable)")
    w.add_argument("--reports", type=Path, default=None, help="report folder (<candidate>/shard-NN.json) whose reports are included")
    w.add_argument("--out", required=True, type=Path, help="new output folder")
    w.set_defaults(func=_write_published)


#: Parser builders, in help order.
COMMANDS: tuple[Builder, ...] = (add_dataset,)
