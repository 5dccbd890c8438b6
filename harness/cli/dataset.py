"""``fidelity dataset build``: package a project's inputs and reports as a relocatable dataset."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.registry import Builder, SubParsers, formatter


def _build(a: argparse.Namespace) -> int:
    from harness.dataset.build import build_dataset, size_lines

    doc = build_dataset(config_path=a.config, reports_dir=a.reports, corpus=a.corpus, tokenizer=a.tokenizer,
                        reference_shards=a.reference_shards, out=a.out)
    print(f"{a.out}: dataset written; sizes per part:")
    for line in size_lines(doc):
        print(line)
    print(f"check it with: fidelity verify {a.out}")
    return 0


def add_dataset(sub: SubParsers) -> None:
    p = sub.add_parser("dataset", help="build a relocatable reference dataset", formatter_class=formatter)
    ss = p.add_subparsers(dest="dataset_cmd", required=True, metavar="{build}")
    b = ss.add_parser("build", help="suite, shard views, reference shards, head, corpus, reports, protocol, card, checksums",
                      formatter_class=formatter,
                      description=("Write one folder (relative paths only) that a stranger can verify and score a\n"
                                   "candidate against without the BF16 model; prints the size of each part and the\n"
                                   "projection at the seed scale.\n\nexample:\n"
                                   "  fidelity dataset build --config fidelity.toml --reports fidelity-reports \\\n"
                                   "      --corpus fixtures/corpus --tokenizer fixtures/model/tokenizer.json \\\n"
                                   "      --reference-shards 0 --out dataset/"))
    b.add_argument("--config", type=Path, default=Path("fidelity.toml"), help="fidelity.toml (suite, reference, head)")
    b.add_argument("--reports", type=Path, default=None,
                   help="report folder of a run (shard-*.json) to include; without it, a reference-only dataset")
    b.add_argument("--corpus", required=True, type=Path, help="folder holding the suite's documents")
    b.add_argument("--tokenizer", required=True, type=Path, help="the suite's tokenizer.json")
    b.add_argument("--reference-shards", default="0", dest="reference_shards", help="shards whose reference is included (default 0)")
    b.add_argument("--out", required=True, type=Path, help="new or empty output folder")
    b.set_defaults(func=_build)


#: Parser builders, in help order.
COMMANDS: tuple[Builder, ...] = (add_dataset,)
