"""``fidelity allocate``: a layout that spends the bytes where the measured effects say, built and measured."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness.allocation.choices import DEFAULT_CHOICES, parse_choices, parse_subset
from harness.allocation.family import Family, GgufFamily, ProjectFamily
from harness.allocation.render import write_allocation
from harness.cli.registry import Builder, SubParsers, formatter, positive_int
from harness.cli.vocabulary import add_quiet, open_out
from harness.errors import UsageError
from harness.inputs.config import load_config
from harness.interchange.suite_manifest import load_any_suite
from harness.reports.report_folder import check_for_writing
from harness.run.allocation_check import check_allocation


def _iv(ci: list[float] | None) -> str:
    return "[not estimable]" if ci is None else f"[{ci[0]:.4e}, {ci[1]:.4e}]"


def _allocate(a: argparse.Namespace) -> int:
    import torch

    from harness.allocation.plan import allocate, request_from_args

    if a.threads:
        torch.set_num_threads(a.threads)
    choices = parse_choices(a.family, a.choices or DEFAULT_CHOICES[a.family])
    sha = load_any_suite(a.suite, verify=False).suite_token_sha256
    folder = open_out(a, sha, entries=["check"] if a.check is not None else [])
    check_config = None
    if a.check is not None:  # checked before the search: the check measures the suite the search measured
        check_config = load_config(a.check)
        found = load_any_suite(check_config.suite, verify=False).suite_token_sha256
        if found != sha:
            raise UsageError(f"--check {a.check}: its suite {check_config.suite}: expected the suite of --suite "
                             f"({a.suite}, suite_token_sha256 {sha}), found suite_token_sha256 {found}")
        check_for_writing(a.out / "check" / "reports", sha, option="--out")
    with tempfile.TemporaryDirectory(prefix="fidelity-allocate-") as tmp:
        family: Family
        if a.family == "project":
            family = ProjectFamily(a.reference, choices)
        else:
            if a.gguf_bf16 is None:
                raise UsageError("--family gguf needs --gguf-bf16 FILE (the BF16 GGUF that llama.cpp quantizes from)")
            family = GgufFamily(a.reference, a.gguf_bf16, choices, Path(tmp), threads=a.threads or 1)
        req = request_from_args(a.reference, a.suite, family, a.base, a.budget, grouping=a.by, shards=a.shards,
                                effects=a.effects, n_boot=a.n_boot, progress=not a.quiet)
        result = allocate(req)
        check = None
        if check_config is not None:
            uniforms = parse_subset(a.family, a.uniforms, family.choices) if a.uniforms else list(family.choices)
            base_model = Path(a.base) if Path(a.base).exists() else None
            check = check_allocation(check_config, result, family, a.out / "check", uniforms=uniforms, shards=a.check_shards,
                                     engine="transformers" if a.family == "project" else "llamacpp",
                                     base_model=base_model)
        paths = folder.record(write_allocation(result, a.out, check))
    ra = result["proxy"]["rank_agreement"]
    agree = ("undefined" if ra["spearman"] is None or ra["kendall"] is None
             else f"Spearman {ra['spearman']:.3f}, Kendall {ra['kendall']:.3f}")
    print(f"effects: {len(result['effects'])} measured (group, choice) pairs on {result['n_contexts']} contexts; proxy rank "
          f"agreement {agree}")
    for p in result["proposals"]:
        print(f"budget {p['budget_spec']} ({p['budget_bytes']} bytes): predicted KLD {p['predicted_kld']['value']:.4e}, "
              f"in process {p['in_process_kld']['value']:.4e}, bytes {p['predicted_bytes']}")
    for q in check["proposals"] if check is not None else []:
        c = q.get("comparator")
        line = f"{q['candidate']}: measured {q['measured_kld']['value']:.4e} ({q['on_disk_bytes']} bytes)"
        if c is not None:
            line += (f" vs {c['candidate']} {c['measured_kld']['value']:.4e} ({c['on_disk_bytes']} bytes): diff "
                     f"{c['paired']['diff']:.4e} {_iv(c['paired']['ci95'])}, {c['paired']['verdict']}")
        print(line)
        h = c.get("paired_held_out") if c is not None else None
        if h is not None:
            print(f"  on the shards the search did not see {h['shards']}: diff {h['diff']:.4e} {_iv(h['ci95'])}, "
                  f"{h['verdict']}")
    print("written: " + ", ".join(str(p) for p in paths if p.suffix in (".md", ".png")))
    return 0


def add_allocate(sub: SubParsers) -> None:
    p = sub.add_parser(
        "allocate", formatter_class=formatter,
        help="propose the layout (bits/group or GGUF type per tensor group) with the lowest predicted KLD within a byte budget",
        description=(
            "Measure the effect on mean KLD of every choice of every tensor group, with the other groups at the base\n"
            "layout (in-process weight swaps, paired with the base), solve the multiple-choice knapsack under each\n"
            "byte budget (scipy.optimize.milp, exact), and check the additivity it assumes by measuring each\n"
            "proposal. Writes allocation.json / .md and, per proposal, layout.json plus recipe.yaml (llm-compressor)\n"
            "or tensor-types.txt (llama-quantize). With --check CONFIG the proposals and the uniform layouts are built\n"
            "and scored as ordinary candidates of CONFIG's suite and reference, with paired comparisons and\n"
            "kld-vs-size.png.\n\n"
            "examples:\n"
            "  fidelity allocate --reference fixtures/model --suite fixtures/suite --base int4_g32 --budget int4_g32 \\\n"
            "      --check fidelity.toml --out allocation/project\n"
            "  fidelity allocate --family gguf --gguf-bf16 fixtures/gguf/fixture-bf16.gguf --reference fixtures/model \\\n"
            "      --suite fixtures/suite --base fixtures/gguf/fixture-q4_k_m.gguf --budget base \\\n"
            "      --check fidelity-gguf.toml --out allocation/gguf"
        ),
    )
    p.add_argument("--reference", required=True, type=Path, help="the BF16 reference model folder")
    p.add_argument("--suite", required=True, type=Path, help="the suite folder")
    p.add_argument("--family", choices=("project", "gguf"), default="project", help="the format the layout is for")
    p.add_argument("--choices", default=None, help="the choices, e.g. int3_g32,int4_g32,int8 or Q4_0,Q5_0,Q8_0 "
                                                  "(default: project " + DEFAULT_CHOICES["project"] + "; gguf " +
                                                  DEFAULT_CHOICES["gguf"] + ")")
    p.add_argument("--base", required=True, help="the base layout: a choice (every unit at it) or a candidate of the family "
                                                 "(a quantization.json folder, a .gguf file)")
    p.add_argument("--budget", required=True, help="budgets, comma-separated: bytes, 'base', or a choice (the bytes of "
                                                   "its uniform layout); several make a sweep")
    p.add_argument("--by", default="block", choices=("module", "block", "layer"), help="grouping (default: block)")
    p.add_argument("--shards", default="0", help="shards the effects are measured on (default 0)")
    p.add_argument("--effects", default="measured", choices=("measured", "proxy"),
                   help="what the knapsack minimises: measured effects (default) or the per-module error proxy")
    p.add_argument("--gguf-bf16", type=Path, default=None, help="--family gguf: the BF16 GGUF to quantize from")
    p.add_argument("--check", type=Path, default=None, metavar="CONFIG",
                   help="build the proposals and uniform layouts and score them with this fidelity.toml's suite and reference")
    p.add_argument("--check-shards", default=None, help="shards for --check (default: all)")
    p.add_argument("--uniforms", default=None, help="uniform layouts built for --check (default: every choice)")
    p.add_argument("--n-boot", type=positive_int, default=10_000, help="bootstrap replicates (default 10000)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch / llama.cpp threads")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    add_quiet(p)
    p.set_defaults(func=_allocate)


COMMANDS: tuple[Builder, ...] = (add_allocate,)
