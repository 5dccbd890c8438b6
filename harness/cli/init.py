"""``fidelity init``: your own model in one command (harness/inputs/project_init.py; docs/commands.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.registry import Builder, SubParsers, formatter, nonneg_int, positive_int
from harness.cli.vocabulary import add_license, add_out, add_quiet
from harness.inputs.project_init import SuiteShape, init_project
from harness.inputs.suite import Suite, describe


def _init(a: argparse.Namespace) -> int:
    shape = SuiteShape(n_ctx=a.n_ctx, contexts=a.contexts, shards=a.shards, seed=a.seed)
    config = init_project(a.reference, list(a.candidate or []), a.out, corpus=a.corpus, from_dataset=a.from_dataset,
                          text_column=a.text_column, license=a.license, shape=shape,
                          progress=None if a.quiet else lambda line: print(line, flush=True))
    print(describe(Suite.load(a.out / "suite")))
    print(f"{config}: written; run it with:\n  pytest {config}\n"
          f"then record the baselines with:\n  pytest {config} --fidelity-update-baselines")
    return 0


def add_init(sub: SubParsers) -> None:
    p = sub.add_parser(
        "init", formatter_class=formatter,
        help="a project for your own model: suite, head and a commented fidelity.toml that pytest runs as it is",
        description=(
            "From a BF16 reference model, one or more candidates and a corpus: check every input (a refusal names\n"
            "it), build the suite with the reference's tokenizer, export the shared head, and write\n"
            "<out>/fidelity.toml. `pytest <out>/fidelity.toml` then captures the reference, scores every\n"
            "candidate x shard and prints the ladder, with one line saying how to record the baselines.\n\n"
            "examples:\n"
            "  fidelity init --reference fixtures/model --candidate fixtures/candidates/int8 \\\n"
            "      --candidate fixtures/candidates/int4_g32 --corpus fixtures/corpus --out my-project\n"
            "  fidelity init --reference hf://org/model@main --candidate q4=quants/model-q4.gguf \\\n"
            "      --from-dataset data/train.parquet --text-column text --out my-project"
        ),
    )
    p.add_argument("--reference", required=True, metavar="MODEL",
                   help="the BF16 original: a model folder (config.json, *.safetensors, tokenizer.json) or hf://org/name[@rev]")
    p.add_argument("--candidate", action="append", metavar="[NAME=]PATH",
                   help="a candidate: a model folder or a .gguf file (repeatable; NAME defaults to the folder or file name)")
    p.add_argument("--corpus", type=Path, nargs="+", default=None, metavar="PATH",
                   help="text files or folders of them (a single folder is used in place; files are copied into <out>/corpus)")
    p.add_argument("--from-dataset", type=Path, default=None, dest="from_dataset", metavar="SOURCE",
                   help="instead of --corpus: a local datasets source (parquet, jsonl, arrow, a save_to_disk folder)")
    p.add_argument("--text-column", default="text", dest="text_column", help="--from-dataset: the text column (default: text)")
    add_license(p, "SPDX license of the corpus documents, recorded in the suite (e.g. CC-BY-4.0)")
    p.add_argument("--n-ctx", type=positive_int, default=512, dest="n_ctx", help="tokens per context (default 512)")
    p.add_argument("--contexts", type=positive_int, default=64, help="contexts in the suite (default 64)")
    p.add_argument("--shards", type=positive_int, default=4, help="shards the contexts are cut into (default 4)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="selection seed (default 0)")
    add_out(p, "the new project folder (new or empty): suite/, lm_head.safetensors, fidelity.toml")
    add_quiet(p)
    p.set_defaults(func=_init)


COMMANDS: tuple[Builder, ...] = (add_init,)
