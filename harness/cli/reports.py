"""Report subcommands of the ``fidelity`` command: ``aggregate``, ``paired``, ``publish`` (``publish verify``; ``verify``
its alias).

Registered through :func:`harness.cli.main.command`; heavy imports happen inside the handlers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.registry import Builder, SubParsers, formatter, nonneg_int, positive_int
from harness.cli.vocabulary import add_config, add_reports, open_out
from harness.dataset.verify import verify_dataset
from harness.errors import FidelityError, UsageError, VerificationError
from harness.inputs.config import load_config
from harness.inputs.suite import Suite
from harness.interchange.ladder_receipts import is_ladder_receipt, read_paired, schema_of
from harness.interchange.manifest_read import SELECTIONS, read_manifest
from harness.interchange.published_reports import (
    aggregate_published,
    is_published_report,
    paired_published,
    report_paths,
)
from harness.interchange.receipt_ladder import aggregate_receipts, manifest_path, paired_receipt
from harness.interchange.suite_manifest import load_any_suite
from harness.io.atomic import atomic_write_json
from harness.reports.aggregate import format_ladder, ladder_rows, not_measured_lines
from harness.reports.paired import paired_report, write_paired
from harness.reports.report_set import (
    aggregate_groups,
    load_reports,
    not_measured,
    publish,
    rederive_set,
    verify_set,
    write_aggregates,
)
from harness.reports.results_json import results_document


# ----------------------------------------------------------------------------- aggregate
def _published_inputs(items: list[Path]) -> list[Path] | None:
    """The published reports among ``items`` (files, or folders holding ``report-*.json``), or None if there are
    none; a mix with this project's shard reports is refused (two methods and formats never combine)."""
    found = [p for p in report_paths(items) if is_published_report(p)]
    if not found:
        return None
    own = [p for p in items if (p.is_file() and not is_published_report(p)) or (p.is_dir() and any(p.rglob("shard-*.json")))]
    if own:
        raise FidelityError(f"{own[0]}: expected only published reports (qwen38-fidelity-report/1..3) beside "
                            f"{found[0]}, found this project's shard reports: the two are never combined")
    return found


def _aggregate_published(a: argparse.Namespace, paths: list[Path]) -> int:
    suite = load_any_suite(a.suite, verify=True)
    folder = open_out(a, suite.suite_token_sha256)
    doc = aggregate_published(paths, suite)
    out = a.out / "published-aggregate.json"
    atomic_write_json(out, doc)
    folder.record([out])
    boot = doc["context_bootstrap"]
    print(f"{doc['candidate']}: {doc['contexts']} contexts, {doc['scored_positions']} positions, token mean KLD "
          f"{doc['token_mean_kld']:.6f}, context mean {boot['mean']:.6f} [{boot['ci95_low']:.6f}, {boot['ci95_high']:.6f}] "
          f"(percentile, context means), top-1 {doc['top1_agreement']:.4f}; method {doc['method']}")
    print(f"{out}: written")
    return 0


def _receipt_inputs(items: list[Path]) -> list[Path] | None:
    """The published ladder receipts among ``items`` (every item must then be one), or None when there are none."""
    found = [p for p in items if is_ladder_receipt(p)]
    if not found:
        return None
    other = [p for p in items if p not in found]
    if other:
        raise FidelityError(f"{other[0]}: expected only published ladder receipts (qwen38-kld-ladder-cumulative) beside "
                            f"{found[0]}, found another file or folder: the two are never combined")
    return found


def _written(lines: list[str]) -> list[Path]:
    """The files a receipts writer names in its ``<file>: written`` lines."""
    return [Path(line.removesuffix(": written")) for line in lines if line.endswith(": written")]


def _sizes(specs: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for spec in specs:
        name, sep, raw = spec.partition("=")
        if not sep or not name or not raw.isdigit():
            raise UsageError(f"--size: expected NAME=BYTES (an integer), found {spec!r}")
        out[name] = int(raw)
    return out


def _aggregate(a: argparse.Namespace) -> int:
    receipts = _receipt_inputs(list(a.reports))
    if receipts is not None:
        folder = open_out(a, read_manifest(manifest_path(a.suite)).suite_token_sha256)
        lines = aggregate_receipts(receipts, a.suite, a.out, method=a.method, selection=a.partition, sizes=_sizes(a.size))
        folder.record(_written(lines))
        for line in lines:
            print(line)
        return 0
    if a.method != "exact" or a.partition != "all" or a.size:
        raise UsageError("aggregate: --method published, --partition and --size apply to published ladder receipts only")
    published = _published_inputs(list(a.reports))
    if published is not None:
        return _aggregate_published(a, published)

    suite = Suite.load(a.suite, verify=True)
    folder = open_out(a, suite.suite_token_sha256)
    groups = load_reports(a.reports)
    folder.check_entries(groups)
    aggs = aggregate_groups(groups, n_shards=None if a.partial else suite.n_shards, suite=suite)
    # the candidates the report folders' own runs could not measure (their ladder.json), never left out
    missing = {m["candidate"]: m for d in a.reports if Path(d).is_dir() for m in not_measured(Path(d), groups)}
    missing_rows = [missing[k] for k in sorted(missing)]
    folder.record(write_aggregates(a.out, groups, aggs, suite=suite, not_measured=missing_rows))
    rows = ladder_rows([r for g in groups.values() for r in g], suite=suite)
    for line in format_ladder(rows) + not_measured_lines(missing_rows):
        print(line)
    if a.results_json is not None:
        import shlex

        command = shlex.join(["fidelity", "aggregate", *map(str, a.reports), "--suite", str(a.suite),
                              *(["--partial"] if a.partial else []), "--out", str(a.out), "--results-json", str(a.results_json)])
        atomic_write_json(a.results_json, results_document(
            rows, command, "pytest <your fidelity.toml> --fidelity-candidates {name} (or fidelity replay of its capture)",
            missing_rows))
        print(f"{a.results_json}: results.json ({len(rows)} entries)")
    print(f"{a.out}: {len(aggs)} candidate aggregate(s), ladder.md, ladder.json")
    return 0


def add_aggregate(sub: SubParsers) -> None:
    p = sub.add_parser(
        "aggregate", help="combine shard reports (per candidate, fail closed) into aggregates and a ladder",
        formatter_class=formatter,
        description=(
            "Group the shard reports by candidate and aggregate each group against the suite. Refuses\n"
            "reports of another suite, a shard number or hash or context range that is not the suite's,\n"
            "reports that differ in any comparability field (window, reference, candidate, head, engine,\n"
            "scorer, schema), overlapping shards or contexts, totals or rows that disagree with their\n"
            "summary, different histogram specs, and (unless --partial) missing shards. The aggregates\n"
            "and the ladder are written together or not at all.\n\n"
            "examples:\n"
            "  fidelity aggregate machineA/ machineB/ --suite suites/s512 --out aggregate/\n"
            "  fidelity aggregate reports/int4/shard-00.json --suite suites/s512 --partial --out agg/"
        ),
    )
    add_reports(p, "shard report files or folders (searched for shard-*.json); or published reports "
                   "(qwen38-fidelity-report/1..3, folders searched for report-*.json): aggregated from their "
                   "per-context rows into <out>/published-aggregate.json; or published ladder receipts "
                   "(qwen38-kld-ladder-cumulative/2, /3): checked against --suite (a suite manifest file), "
                   "re-derived into <out>/receipts.md, receipts.json, ladder.md and (with --size) kld-vs-size.png",
                positional=True, many=True, required=True)
    p.add_argument("--suite", required=True, type=Path,
                   help="the suite the reports were scored on (every report is checked against it; a published "
                        "suite folder with suite-manifest.json is read in place)")
    p.add_argument("--partial", action="store_true", help="allow a subset of the suite's shards (default: every shard is required)")
    p.add_argument("--method", choices=("exact", "published"), default="exact",
                   help="published ladder receipts only: published prints only the receipts' figures re-derived by the "
                        "published method; exact (default) adds this project's studentized interval beside them")
    p.add_argument("--partition", choices=SELECTIONS, default="all",
                   help="published ladder receipts only: restrict the rows to a partition of a /3+ suite manifest "
                        "(analysis, qualification, sentinel); the figures are then re-derived, not compared")
    p.add_argument("--size", action="append", default=[], metavar="NAME=BYTES",
                   help="published ladder receipts only: a candidate's size in bytes, for ladder.md and kld-vs-size.png")
    p.add_argument("--results-json", dest="results_json", type=Path, default=None,
                   help="also write the ladder as results.json: one entry per candidate (size, mean KLD and interval, "
                        "top-1, positions, engine, identity, how to re-measure it), for plotting")
    p.add_argument("--out", required=True, type=Path, help="folder for <candidate>/aggregate.json and ladder.md/json")
    p.set_defaults(func=_aggregate)


# ----------------------------------------------------------------------------- paired
def _paired_published(a: argparse.Namespace, pa: list[Path], pb: list[Path]) -> int:
    suite = None if a.suite is None else load_any_suite(a.suite, verify=True)
    folder = open_out(a, None if suite is None else suite.suite_token_sha256, entries=["paired"])
    doc = paired_published(pa, pb, suite)
    out = a.out / "paired" / f"{a.name_a}-vs-{a.name_b}.published.json"
    atomic_write_json(out, doc)
    folder.record([out])
    print(f"{a.name_a} vs {a.name_b}: difference a - b {doc['difference_a_minus_b']:+.6g}, 95% "
          f"[{doc['ci95_low']:+.6g}, {doc['ci95_high']:+.6g}] (percentile, context means; {doc['clusters']} clusters), "
          f"a wins {doc['a_wins']}, b wins {doc['b_wins']}, ties {doc['ties']}; method {doc['method']}")
    print(out)
    return 0


def _paired_receipts(a: argparse.Namespace) -> int:
    if a.b is not None or not str(schema_of(a.a)).startswith("qwen38-kld-ladder-paired/"):
        raise UsageError(f"paired: expected one paired ladder receipt (qwen38-kld-ladder-paired) alone, found {a.a}"
                            + ("" if a.b is None else f" and {a.b}"))
    # without --suite, the suite the receipt states it was measured on (paired_receipt checks it against --suite)
    stated = (read_paired(a.a).get("suite") or {}).get("suite_token_sha256")
    folder = open_out(a, read_manifest(manifest_path(a.suite)).suite_token_sha256 if a.suite is not None
                      else stated if isinstance(stated, str) else None)
    lines = paired_receipt(a.a, a.out, suite=a.suite, inputs=a.inputs, margin=a.margin, method=a.method)
    folder.record(_written(lines))
    for line in lines:
        print(line)
    return 0


def _paired(a: argparse.Namespace) -> int:
    from harness.run.replay.stores import verify_inputs
    from harness.run.shard import shard_positions

    if a.b is None or is_ladder_receipt(a.a):
        return _paired_receipts(a)
    pa, pb = _published_inputs([a.a]), _published_inputs([a.b])
    if pa is not None and pb is not None:
        return _paired_published(a, pa, pb)
    if pa is not None or pb is not None:
        raise UsageError(f"paired: expected two capture stores or two sets of published reports, found one of each "
                         f"({a.a}, {a.b})")
    if a.suite is None or a.reference is None or a.head is None:
        raise UsageError("paired: two capture stores need --suite, --reference and --head")

    margin = a.margin
    if margin is None and a.config is not None:
        cfg = load_config(a.config)
        margin = next((p.margin for p in cfg.pairs if (p.a, p.b) == (a.name_a, a.name_b)), None)
    if margin is None:
        raise UsageError("paired: no equivalence margin: pass --margin NATS, or --config with a matching [[pairs]] entry")
    folder = open_out(a, load_any_suite(a.suite, verify=False).suite_token_sha256, entries=["paired"])
    inputs = {}
    for side, store in (("a", a.a), ("b", a.b)):
        inputs[side] = verify_inputs(a.suite, a.reference, store, a.head, shards=a.shards, score_from=a.window)
    pos = {
        side: [shard_positions(i.shard_inputs(s, a.window), device=a.device) for s in i.shards]
        for side, i in inputs.items()
    }
    rep = paired_report(a.name_a, a.name_b, pos["a"], pos["b"], margin=margin, score_from=a.window, n_boot=a.n_boot)
    json_path, md_path = folder.record(write_paired(a.out, rep))
    ci, cm = rep["kld_mean"]["ci95"], rep["certifiable_margin"]
    iv = "95% interval not estimable (too few source clusters)" if ci is None else f"95% [{ci[0]:.4g}, {ci[1]:.4g}]"
    print(f"{a.name_a} vs {a.name_b}: {rep['verdict_named']} (mean KLD difference {rep['kld_mean']['diff']:.4g}, "
          f"{iv}, margin ±{margin:g}" + ("" if cm is None else f", smallest certifiable margin ±{cm:.4g}") + "; TOST 2.5% per side)")
    print(f"{json_path}\n{md_path}")
    return 0


def add_paired(sub: SubParsers) -> None:
    p = sub.add_parser(
        "paired", help="paired comparison of two candidates' capture stores (common random numbers)",
        formatter_class=formatter,
        description=(
            "Score two candidate stores against one reference on the same positions and bootstrap\n"
            "the differences a - b (mean KLD, p99, CVaR1%%, top-1, EAR) with the same cluster draws.\n"
            "Verdict on the mean-KLD difference: equivalent (interval inside ±margin), A better,\n"
            "B better (interval excludes 0) or inconclusive. Writes <out>/paired/<a>-vs-<b>.json/.md.\n\n"
            "example:\n"
            "  fidelity paired stores/int4_g32 stores/int4_g32_b --suite suites/s512 --reference stores/ref \\\n"
            "      --head lm_head.safetensors --margin 0.001 --out reports/"
        ),
    )
    p.add_argument("a", type=Path, help="capture store of candidate A (or its published report(s): a qwen38-fidelity-report "
                                        "file or a folder of report-*.json, compared from their per-context rows, no rescoring)")
    p.add_argument("b", type=Path, nargs="?", default=None,
                   help="capture store of candidate B (or its published report(s)); absent when A is a paired ladder "
                        "receipt (qwen38-kld-ladder-paired), whose comparisons are re-derived from its inputs")
    p.add_argument("--inputs", type=Path, default=None,
                   help="paired ladder receipt only: folder holding its input receipts (default: the receipt's folder)")
    p.add_argument("--method", choices=("exact", "published"), default="exact",
                   help="paired ladder receipt only: published prints only the re-derived published figures; exact (default) "
                        "adds this project's studentized interval and verdict (at --margin)")
    p.add_argument("--suite", type=Path, default=None, help="suite folder (required for stores; checks published reports)")
    p.add_argument("--reference", type=Path, default=None, help="reference capture store (stores only)")
    p.add_argument("--head", type=Path, default=None, help="shared lm_head.safetensors (stores only)")
    p.add_argument("--out", required=True, type=Path, help="report folder (paired/ is created inside)")
    p.add_argument("--name-a", dest="name_a", default=None, help="name of A (default: its folder name)")
    p.add_argument("--name-b", dest="name_b", default=None, help="name of B (default: its folder name)")
    p.add_argument("--margin", type=float, default=None, help="equivalence margin on mean KLD, nats")
    add_config(p, "fidelity.toml whose [[pairs]] entry gives the margin")
    p.add_argument("--shards", default=None, help="shards, e.g. 0,2-3 (default: all)")
    p.add_argument("--window", type=nonneg_int, default=0, help="score_from (default 0)")
    p.add_argument("--n-boot", dest="n_boot", type=positive_int, default=10_000, help="bootstrap replicates (default 10000)")
    p.add_argument("--device", default="cpu", help="scoring device (default cpu)")

    def run(a: argparse.Namespace) -> int:
        a.name_a = a.name_a or a.a.resolve().name
        a.name_b = a.name_b or (a.b.resolve().name if a.b is not None else "")
        return _paired(a)

    p.set_defaults(func=run)


# ----------------------------------------------------------------------------- publish / verify
def _publish(a: argparse.Namespace) -> int:
    if a.reports is None or a.out is None:
        raise UsageError("publish: --reports and --out are required (or: fidelity publish verify DIR)")
    cfg = None
    if a.config is not None:
        cfg = load_config(a.config)
    suite = None
    if a.suite is not None:
        suite = Suite.load(a.suite, verify=True)
    files = publish(a.reports, a.out, config=cfg, n_shards=a.complete, suite=suite, baselines_dir=a.baselines)
    print(f"{a.out}: {len(files)} files, checksums in {a.out / 'checksums.txt'}; check with: fidelity publish verify {a.out}")
    return 0


def add_publish(sub: SubParsers) -> None:
    p = sub.add_parser(
        "publish", help="write the publishable report set (ladder, results, plots, per-candidate pages, checksums)",
        formatter_class=formatter,
        description=(
            "From a report folder (pytest --fidelity-report-dir or fidelity replay output), write:\n"
            "README.md (a Hugging Face model card: license, tags, base_model from the config's [card],\n"
            "model-index results per candidate, the ladder and the plots), ladder.md, results.json,\n"
            "kld-vs-size.json/.png, tails.png (with tail reports), <candidate>/report.md and\n"
            "checksums.txt (sha256sum format). Every report is checked against the suite (--suite, or\n"
            "the suite of --config); verdicts are recomputed from the reports and the baselines\n"
            "(--baselines, or those of --config), never copied. The set appears whole or not at all.\n\n"
            "examples:\n  fidelity publish --reports fidelity-reports --out publish/ --config fidelity.toml\n"
            "  fidelity publish verify publish/\n"
            "  hf upload your-name/your-model-fidelity publish/ . --repo-type model   # huggingface_hub's upload"
        ),
    )
    add_reports(p, "report folder (required to publish)")
    p.add_argument("--out", type=Path, default=None, help="output folder (must be new or empty; required to publish)")
    add_config(p, "fidelity.toml (suite, baselines, reproduction commands)")
    p.add_argument("--suite", type=Path, default=None, help="suite folder (required unless --config names it)")
    p.add_argument("--baselines", type=Path, default=None, help="baseline folder for the verdicts (default: the config's)")
    p.add_argument("--complete", type=positive_int, metavar="N", default=None, help="require all N shards per candidate")
    p.set_defaults(func=_publish)
    ss = p.add_subparsers(dest="publish_cmd", required=False, metavar="{verify}")
    _add_verify(ss, "check a published set or dataset: checksums, then its numbers re-derived; exit 1 if tampered")


def _verify(a: argparse.Namespace) -> int:
    if (a.dir / "dataset.json").is_file():  # a reference dataset (fidelity dataset build)

        doc = verify_dataset(a.dir)
        print(f"{a.dir}: OK (dataset: checksums, suite, shard views, reference shard(s) {doc['reference']['shards']}, "
              f"head, tokenizer, corpus and {sum(len(v) for v in doc['candidates'].values())} reports agree)")
        return 0
    problems = verify_set(a.dir)
    if not problems:
        problems = rederive_set(a.dir)
    if problems:
        for line in problems[:-1]:
            print(f"fidelity: {line}")
        raise VerificationError(a.dir, "published set", "every file as listed in checksums.txt and as re-derived from its shard reports",
                                f"{len(problems)} problem(s); last: {problems[-1]}")
    n = len((a.dir / "checksums.txt").read_text().splitlines())
    print(f"{a.dir}: OK ({n} files match checksums.txt, no extra files; ladder, results and plot points re-derived from the shard reports)")
    return 0


def _add_verify(sub: SubParsers, help: str) -> None:
    p = sub.add_parser("verify", help=help, formatter_class=formatter,
                       description="Check a published set (fidelity publish) or a reference dataset (fidelity dataset build):\n"
                                   "every file against checksums.txt, then its numbers re-derived from its shard reports.\n"
                                   "Exit 1 if anything was changed, added or removed.\n\n"
                                   "example:\n  fidelity publish verify publish/")
    p.add_argument("dir", type=Path, help="published set or dataset folder")
    p.set_defaults(func=_verify)


def add_verify(sub: SubParsers) -> None:
    """The top-level ``fidelity verify``: an alias of ``fidelity publish verify``."""
    _add_verify(sub, "alias of `fidelity publish verify`")


#: Parser builders, in help order.
COMMANDS: tuple[Builder, ...] = (add_aggregate, add_paired, add_publish, add_verify,)
