"""Aggregation of report folders and the publishable report set (``fidelity aggregate``,
``fidelity publish``, ``fidelity verify``).

A *report folder* is what a pytest run (``--fidelity-report-dir``) or ``fidelity replay`` writes:
``<candidate>/shard-NN.json`` shard reports, and optionally ``tails.json``, ``window.json``,
``adaptive.json`` and ``paired/*.json``. Several folders (say, two machines that ran different
shards) may be passed together: their shard reports are grouped per candidate and each group is
aggregated under the fail-closed rules of :mod:`harness.reports.aggregate`.

Reasoning: docs/reports.md §"The publishable report set".
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from harness import PROTOCOL_VERSION
from harness.errors import FidelityError, VerificationError
from harness.gate.adaptive import check_adaptive
from harness.gate.baselines import Baseline, baseline_path, headline_of
from harness.inputs.suite import Suite
from harness.io.atomic import atomic_write_files, atomic_write_text, dumps_json, staged_directory
from harness.io.hashing import sha256_file
from harness.io.jsonio import read_json
from harness.io.md_table import md_table
from harness.io.schema import MapOf, Nullable, Optional, check, checked
from harness.metrics.records import ContextRow
from harness.reports.aggregate import (
    Aggregate,
    FloorRecord,
    NotMeasured,
    aggregate,
    annotate_floor,
    format_ladder,
    ladder_files,
    ladder_notes,
    ladder_rows,
    matching_floor,
    not_measured_lines,
)
from harness.reports.card import CardInfo, card_info, render_card, split_card
from harness.reports.diagnostics import diagnostics_lines
from harness.reports.numbers import fmt_opt
from harness.reports.paired import PairedReport, verify_paired
from harness.reports.plot import PublishedPoint, pareto_front, plot_ccdf, plot_kld_vs_size
from harness.reports.shard import ShardReport, report_shard
from harness.reports.suite_shape import SuiteLike, SuiteShape
from harness.reports.tails import FILE_SCHEMA as TAILS_FILE_SCHEMA
from harness.reports.tails import REPORT_SCHEMA, TailReport, verify_tail_report
from harness.reports.units import bpw_text, size_text
from harness.reports.windows import WindowComparison, verify_window

if TYPE_CHECKING:
    from harness.inputs.config import FidelityConfig

SCHEMA_RESULTS = "fidelity.results/1"
CHECKSUMS = "checksums.txt"
GIB = 2**30


class TailsFile(TypedDict):
    """A run's ``tails.json``."""

    schema: str
    candidates: list[TailReport]


class Reproduction(TypedDict):
    """What the "How to reproduce" sections need from the configuration (``results.json``'s ``reproduction``):
    the configuration's file name, the suite, the reference store and head, each candidate's store (None: none)."""

    config: str
    suite: str
    reference: str
    head: str
    stores: dict[str, str | None]


class Extras(TypedDict):
    """What a published set holds beside the shard reports, each checked against them when read: tail reports
    by candidate, the window comparison, the paired comparisons, the adaptive record (``adaptive.json`` as
    :func:`harness.gate.adaptive.check_adaptive` accepts it) and the precision floor of the suite and reference."""

    tails: dict[str, TailReport]
    window: WindowComparison | None
    paired: list[PairedReport]
    adaptive: object
    floor: FloorRecord | None


class RenderedSet(TypedDict):
    """Every derived file of a published set by relative path (but the plots and checksums), the plot's points
    and the precision floor shown."""

    files: dict[str, str]
    points: list[PublishedPoint]
    floor: FloorRecord | None


# ------------------------------------------------------------------ reading report folders
def find_shard_reports(paths: Iterable[str | Path]) -> list[Path]:
    """Shard report files named by ``paths`` (files as given; folders searched for ``shard-*.json``)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(q for q in p.rglob("shard-*.json") if q.is_file())
        elif p.is_file():
            out.append(p)
        else:
            raise FidelityError(f"{p}: no such report file or folder")
    if not out:
        raise FidelityError(f"{', '.join(map(str, paths))}: no shard reports (shard-*.json) found")
    return out


def load_reports(paths: Iterable[str | Path]) -> dict[str, list[ShardReport]]:
    """Shard reports grouped per candidate (each report remembers its file as ``source``)."""
    groups: dict[str, list[ShardReport]] = {}
    for f in find_shard_reports(paths):
        r = ShardReport.load(f)
        r.source = str(f)  # named in fail-closed errors
        groups.setdefault(r.candidate, []).append(r)
    return dict(sorted(groups.items()))


def aggregate_groups(groups: dict[str, list[ShardReport]], *, n_shards: int | None = None, suite: SuiteLike | None = None) -> dict[str, Aggregate]:
    """Aggregate each candidate's reports (fail closed); ``suite`` checks every report against the
    suite (hash, shard index and hash, contexts; :func:`harness.reports.aggregate.check_against_suite`)."""
    return {name: aggregate(reports, n_shards=n_shards, suite=suite) for name, reports in groups.items()}


def write_aggregates(out_dir: str | Path, groups: dict[str, list[ShardReport]], aggs: Mapping[str, Aggregate], *,
                     suite: SuiteLike | None = None, not_measured: Sequence[NotMeasured] = ()) -> list[Path]:
    """``<out>/<candidate>/aggregate.json`` per candidate plus ``ladder.md``/``ladder.json`` (listing the
    ``not_measured`` candidates), as one unit."""
    out = Path(out_dir)
    files: dict[Path, str] = {out / name / "aggregate.json": dumps_json(agg) for name, agg in aggs.items()}
    files.update(ladder_files(out, ladder_rows([r for g in groups.values() for r in g], suite=suite), None, not_measured))
    return atomic_write_files(files)


#: What a published set reads from a run's summaries (harness.io.schema): a summary that lies is a named refusal.
TAILS_SCHEMA = TAILS_FILE_SCHEMA
WINDOW_SCHEMA = {"base_window": int, "ranking_base": [str], "verdict": str, "power": object, "shards": Optional([int]),
                 "windows": MapOf({"ranking": [str], "flips": {"failures": [[str]], "warnings": [[str]]},
                                   "candidates": MapOf({"score_from": int, "n_positions": int, "n_contexts": int,
                                                        "mean_kld": float, "ci95": Nullable([float]),
                                                        "rel_change_mean_kld": Nullable(float),
                                                        "clusters": {"names": [str], "sum_kld": [float], "positions": [float],
                                                                     "n_boot": int, "seed": int}})})}
PAIRED_SCHEMA = {"a": str, "b": str, "verdict": str, "verdict_named": str, "margin": float, "certifiable_margin": Nullable(float),
                 "n_positions": int, "n_clusters": int, "bootstrap": {"n_boot": int, "seed": int},
                 "kld_mean": {"a": float, "b": float, "diff": float, "ci95": Nullable([float])},
                 "contexts": {"a_wins": int, "b_wins": int, "ties": int}, "shards": Optional([int])}


def _read_json(path: Path, schema: object = object) -> object:
    """The document at ``path`` checked against ``schema`` (None when there is no file)."""
    if not path.is_file():
        return None
    doc = read_json(path)
    check(doc, schema, path)
    return doc


def _context_rows(groups: dict[str, list[ShardReport]]) -> dict[str, dict[int, list[ContextRow]]]:
    return {name: {report_shard(r): list(r.metrics["contexts"]) for r in reps} for name, reps in groups.items()}


def _check_tails(reps: Sequence[TailReport], path: Path, where: str, groups: dict[str, list[ShardReport]]) -> None:
    for i, rep in enumerate(reps):
        reports = groups.get(rep["candidate"])
        if not reports:
            raise VerificationError(path, f"{where}[{i}].candidate", f"a candidate with shard reports ({', '.join(groups)})",
                                    rep["candidate"])
        verify_tail_report(rep, path, f"{where}[{i}]", {report_shard(r): r.metrics for r in reports})


def _read_tails(path: Path, groups: dict[str, list[ShardReport]]) -> dict[str, TailReport]:
    """A run's ``tails.json`` by candidate ({} when absent), checked against its schema and re-derived from the
    shard reports."""
    raw = _read_json(path, TAILS_SCHEMA)
    if raw is None:
        return {}
    doc = checked(raw, TailsFile, path)
    _check_tails(doc["candidates"], path, "candidates", groups)
    return {t["candidate"]: t for t in doc["candidates"]}


def _check_paired(rep: PairedReport, path: str | Path, groups: dict[str, list[ShardReport]], config: FidelityConfig | None = None) -> None:
    rows = _context_rows({k: v for k, v in groups.items() if k in (rep["a"], rep["b"])})
    for side in ("a", "b"):
        if rep[side] not in rows:
            raise VerificationError(path, side, f"a candidate with shard reports ({', '.join(groups)})", rep[side])
    pair = next((p for p in getattr(config, "pairs", ()) if (p.a, p.b) == (rep["a"], rep["b"])), None)
    rule = rep.get("margin_rule")
    kind = "absolute" if rule is None else rule["kind"]
    if pair is not None and pair.margin_kind != kind:
        raise VerificationError(path, "margin_rule.kind", f"{pair.margin_kind!r} (the pair's margin in the configuration)", kind)
    absolute = pair is not None and pair.margin_kind == "absolute"
    verify_paired(rep, path, rows[rep["a"]], rows[rep["b"]], margin=pair.margin if absolute and pair else None,
                  n_boot=None if config is None else config.n_boot)


def _read_paired(path: Path, groups: dict[str, list[ShardReport]], config: FidelityConfig | None = None) -> PairedReport:
    """A run's ``paired/<a>-vs-<b>.json``, checked against its schema and re-derived from the shard reports."""
    doc = checked(_read_json(path, PAIRED_SCHEMA), PairedReport, path)
    _check_paired(doc, path, groups, config)
    return doc


def _read_window(path: Path, groups: dict[str, list[ShardReport]],
                 config: FidelityConfig | None = None) -> WindowComparison | None:
    """A run's ``window.json`` (None when absent), checked against its schema, itself and the shard reports."""
    raw = _read_json(path, WINDOW_SCHEMA)
    if raw is None:
        return None
    doc = checked(raw, WindowComparison, path)
    verify_window(doc, path, _context_rows(groups), n_boot=None if config is None else config.n_boot)
    return doc


def _read_adaptive(path: Path, groups: dict[str, list[ShardReport]]) -> object:
    """A run's ``adaptive.json`` (None when absent), checked against its schema and the shard reports."""
    doc = _read_json(path)
    if doc is not None:
        check_adaptive(doc, path, _context_rows(groups))
    return doc


# ------------------------------------------------------------------ the publishable set
def size_points(aggs: Mapping[str, Aggregate]) -> list[PublishedPoint]:
    """Points of the KLD-versus-size plot, with the Pareto flag (fewer bits per weight -- on-disk size where a
    candidate's bits per weight are unknown -- and closer than all others); ``bpw``, ``linear_bpw`` and ``params``
    from the candidate's :mod:`bits per weight <harness.allocation.bits_per_weight>` (None when unknown)."""
    pts: list[PublishedPoint] = []
    for name, a in aggs.items():
        cand = a["comparability"]["candidate"]
        size = _int_or_none(cand.get("size_bytes"))
        b = cand.get("bits_per_weight") or {}
        bpw: Mapping[str, object] = b if isinstance(b, Mapping) else {}
        pts.append({"candidate": name, "size_bytes": size, "size_gib": None if not size else size / GIB,
                    "bpw": _float_or_none(bpw.get("total_bpw")), "linear_bpw": _float_or_none(bpw.get("linear_bpw")),
                    "params": _int_or_none(bpw.get("total_params")),
                    "mean_kld": a["kld"]["mean"], "ci95": a["kld"]["ci95"], "pareto": False})
    by_bpw = bool(pts) and all(p["bpw"] is not None for p in pts)
    xs = [(p.get("bpw") if by_bpw else p["size_gib"], p) for p in pts]
    front = {n for _, _, n in pareto_front([(x, p["mean_kld"], p["candidate"]) for x, p in xs if x])}
    for p in pts:
        p["pareto"] = p["candidate"] in front
    return sorted(pts, key=lambda p: (p["size_gib"] is None, p["size_gib"] or 0.0, p["candidate"]))


def _int_or_none(value: object) -> int | None:
    """A recorded count (bytes, parameters), None when absent or not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: object) -> float | None:
    """A recorded number (bits per weight), None when absent or not a number."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def page_size(size: int | None) -> str:
    """A candidate page's on-disk size: ``1.771 MiB (1856707 bytes)`` (unit as in :mod:`harness.reports.units`)."""
    if not size:
        return "—"

    return f"{size_text(size, 3)} ({size} bytes)"


def reproduction_info(config: FidelityConfig | None, names: Iterable[str]) -> Reproduction | None:
    """What the "How to reproduce" sections need from the configuration (recorded in
    ``results.json``, so ``fidelity verify`` can re-render the pages without the config)."""
    if config is None:
        return None
    stores: dict[str, str | None] = {}
    for name in names:
        try:
            cand = config.candidate(name)
        except FidelityError:
            cand = None
        stores[name] = None if cand is None or cand.store is None else str(cand.store)
    return {"config": config.path.name, "suite": str(config.suite), "reference": str(config.reference.store),
            "head": str(config.reference.head), "stores": stores}


def _reproduce(name: str, agg: Aggregate, repro: Reproduction | None) -> list[str]:
    shards = ",".join(str(s["index"]) for s in agg["shards"])
    window = agg["score_from"]
    # pytest pointed at the configuration file collects its cases; --fidelity-candidates selects by exact name
    toml = shlex.quote(str(repro["config"])) if repro is not None else "fidelity.toml"
    suite = shlex.quote(str(repro["suite"])) if repro is not None else "SUITE"
    lines = ["```sh", f"pytest {toml} --fidelity-candidates {name} --fidelity-shards {shards}"
             + (f" --fidelity-window {window}" if window else "") + " --fidelity-report-dir reports",
             f"fidelity aggregate reports/{name} --suite {suite} --out aggregate/", "```"]
    store = None if repro is None else (repro.get("stores") or {}).get(name)
    if repro is not None and store is not None:
        lines += ["", "or, from the stored captures:", "", "```sh",
                  f"fidelity replay --suite {repro['suite']} --reference {repro['reference']} "
                  f"--candidate {store} --head {repro['head']} --out reports/{name}", "```"]
    return lines


def render_candidate(name: str, agg: Aggregate, shards: Sequence[ShardReport], tails: TailReport | None,
                     window: WindowComparison | None, pairs: Sequence[PairedReport], repro: Reproduction | None) -> str:
    """One page: headline, interval, tails, window control, pairs, identity, how to reproduce."""
    k = agg["kld"]
    lo, hi = k["ci95"] or (None, None)
    comp = agg["comparability"]
    size = _int_or_none(comp["candidate"].get("size_bytes"))
    shard_list = ", ".join(f"{s['index']:02d}" for s in agg["shards"])
    lines = [f"# {name}", "",
             f"**Mean KLD {fmt_opt(k['mean'])} nats** (95% interval "
             f"{'not estimable (too few source clusters)' if lo is None else f'[{fmt_opt(lo)}, {fmt_opt(hi)}]'}, "
             "studentized source-cluster bootstrap, "
             f"{agg['bootstrap']['n_boot']} replicates, seed {agg['bootstrap']['seed']}) against "
             f"`{comp['reference']['name']}`, over {agg['n_positions']} positions in {agg['n_contexts']} contexts "
             f"({agg['n_clusters']} source clusters), shards {shard_list}, "
             f"score_from={agg['score_from']}.", ""]
    top1 = agg["top1"]
    lines += md_table(["metric", "value"], [
        ["top-1 agreement", f"{top1['agreement']:.4f} "
         + (f"[{top1['ci95'][0]:.4f}, {top1['ci95'][1]:.4f}]" if top1["ci95"] else "[not estimable]")],
        ["EAR", fmt_opt(agg["ear"]["mean"])],
        ["mean JSD (bits)", fmt_opt(agg["jsd_bits"]["mean"])],
        ["PPL ref / cand", f"{agg['ppl']['ref']:.4f} / {agg['ppl']['cand']:.4f}"],
        ["max KLD", fmt_opt(k["max"])],
        ["on-disk size", page_size(size)],
        ["bits per weight (quantized linears / whole checkpoint)", bpw_text(comp["candidate"].get("bits_per_weight"))],
    ]) + [""]
    lines += ["## Tails", ""]
    if tails:
        cum = tails["cumulative"]
        lines += md_table(["", "p50", "p90", "p99", "p99.9", "CVaR1%", "max"],
                          [["exact (all positions)", *(fmt_opt(cum["percentiles"][p]) for p in ("p50", "p90", "p99", "p99.9")),
                            fmt_opt(cum["cvar1"]), fmt_opt(cum["max"])]]) + [""]
    else:
        toml = str(repro["config"]) if repro is not None else "fidelity.toml"
        lines += [f"Bin-bounded percentiles from the summed histograms (exact tails: run "
                  f"`pytest {shlex.quote(toml)} -m fidelity_tails --fidelity-candidates {name}`):", ""]
        lines += md_table(["percentile", "bracket (nats)"],
                          [[q, f"[{fmt_opt(b[0])}, {fmt_opt(b[1])}]"] for q, b in k["quantile_bounds"].items()])
        lines.append("")
    lines += ["Exceedance counts (exact): " + ", ".join(f"KLD > {t}: {c}" for t, c in agg["exceedance"].items()) + ".", ""]
    if "diagnostics" in agg:
        lines += diagnostics_lines(agg["diagnostics"])
    if window:
        lines += ["## Scoring-window control", "", f"Verdict: {window['verdict']}.", ""]
        rows = []
        for kk, w in sorted(window["windows"].items(), key=lambda t: int(t[0])):
            d = w["candidates"].get(name)
            if d:
                rel = "—" if d["rel_change_mean_kld"] is None else f"{100 * d['rel_change_mean_kld']:+.1f}%"
                rows.append([kk, fmt_opt(d["mean_kld"]), rel])
        lines += md_table(["score_from", "mean KLD", "change"], rows)
        lines.append("")
    if pairs:
        lines += ["## Paired comparisons", ""]
        for p in pairs:
            plo, phi = p["kld_mean"]["ci95"] or (None, None)
            lines.append(f"- {p['a']} vs {p['b']}: **{p['verdict_named']}** (difference {fmt_opt(p['kld_mean']['diff'])}, "
                         f"95% [{fmt_opt(plo)}, {fmt_opt(phi)}], margin ±{p['margin']:g})")
        lines.append("")
    lines += ["## Identity", ""]
    lines += md_table(["field", "value"], [[key, f"`{json.dumps(comp.get(key), sort_keys=True)}`"] for key in (
        "protocol_version", "harness_version", "suite_token_sha256", "reference", "candidate", "head_sha256",
        "cand_head_sha256", "engine", "scorer")])
    lines += ["", "Shard hashes: " + ", ".join(f"{s['index']:02d} `{s['sha256'][:16]}…`" for s in agg["shards"]) + ".", "",
              "## How to reproduce", ""] + _reproduce(name, agg, repro) + [""]
    return "\n".join(lines)


README = """\
## What is measured

Exact full-vocabulary KL divergence KL(p‖q) of each candidate's next-token distribution (q)
from the BF16 reference's (p), in nats, on a fixed suite of token contexts. Both models' final
hidden states go through one shared BF16 LM head, so the number measures the model body.

## Protocol (version {protocol})

* Suite: fixed token ids (never re-tokenized), `n_ctx` tokens per context; rows `score_from .. n_ctx-2`
  of every context are scored (this set: score_from = {windows}).
* Per position: KLD, top-1 agreement, EAR = Σ min(p, q), JSD, NLL of the true next token.
* Headline: token-mean KLD with a 95% **studentized source-cluster bootstrap** interval
  (whole source documents resampled; fixed seed; bootstrap-t, each side read at a level set by the
  clusters' count, the mean's relative standard error and the clusters' kurtosis; not estimable below 8 source clusters).
* Tails: exact per-shard percentiles; cumulative percentiles are bracketed by a fixed
  log-spaced histogram (40 bins per decade) whose counts add across shards; exceedance counts
  are exact.
* Paired comparisons: common-random-number studentized bootstrap of the difference, each end read at a level set
  by the clusters' count and their skewness toward and away from it (as for top-1 and EAR); verdict
  `equivalent` when the 95% interval lies within ±margin (TOST, alpha 0.025 per side: each end of the 95% interval).

## Files

| file | content |
|---|---|
| `ladder.md` | one row per candidate, sorted by mean KLD |
| `results.json` | every measurement: aggregates, every shard report, tails, windows, pairs |
| `tails.png` | (when the set holds tail reports) fraction of positions with KLD ≥ x, per candidate, log-log; the numbers are in `results.json` (`candidates.<name>.tails`) |
| `kld-vs-size.json`, `kld-vs-size.png` | mean KLD (log scale, interval bars) versus on-disk size (the png's axis in GiB, or MiB when every candidate is under 1 GiB, like the sizes in `ladder.md` and the pages; the json in GiB: `size_gib`), Pareto frontier; below, each 95% interval relative to its mean (%), to scale; colours as in `tails.png` |
| `<candidate>/report.md` | one page per candidate: headline, interval, tails, window control, identity, how to reproduce |
| `checksums.txt` | sha256 of every other file |

## Verify

```sh
fidelity verify .          # refuses a changed, missing or extra file
sha256sum -c checksums.txt # the same check with coreutils (does not detect extra files)
```

Candidates: {candidates}.
"""


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != CHECKSUMS)


def write_checksums(root: str | Path) -> Path:
    """``checksums.txt``: ``<sha256>  <relative path>`` per file, sorted (``sha256sum -c`` format)."""
    root = Path(root)
    text = "".join(f"{sha256_file(root / rel)}  {rel}\n" for rel in _files(root))
    atomic_write_text(root / CHECKSUMS, text)
    return root / CHECKSUMS


def verify_set(root: str | Path) -> list[str]:
    """Problems of a published set (empty: intact): changed, missing or extra files, bad lines."""
    root = Path(root)
    listing = root / CHECKSUMS
    if not listing.is_file():
        return [f"{listing}: missing (not a published set, or the listing was removed)"]
    problems, listed = [], set()
    try:
        text = listing.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        return [f"{listing}: encoding: expected UTF-8 text, found byte {e.start}: {e.reason}"]
    for n, line in enumerate(text.splitlines(), 1):
        sha, sep, rel = line.partition("  ")
        if not sep or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            problems.append(f"{listing}:{n}: expected '<sha256>  <path>', found {line!r}")
            continue
        target = (root / rel).resolve()
        if rel.startswith("/") or ".." in Path(rel).parts or not target.is_relative_to(root.resolve()):
            problems.append(f"{listing}:{n}: path {rel!r} leaves the set's folder")
            continue
        listed.add(rel)
        if not (root / rel).is_file():
            problems.append(f"{root / rel}: missing (listed in {CHECKSUMS})")
        elif (found := sha256_file(root / rel)) != sha:
            problems.append(f"{root / rel}: sha256: expected {sha}, found {found} (changed)")
    for rel in _files(root):
        if rel not in listed:
            problems.append(f"{root / rel}: extra file (not listed in {CHECKSUMS})")
    return problems


def derive_verdicts(groups: dict[str, list[ShardReport]], baselines: Mapping[str, Baseline]) -> dict[tuple[str, int], bool]:
    """Each report's verdict recomputed from its numbers and its candidate's baseline
    (:class:`~harness.gate.baselines.Baseline`); candidates without a baseline get none."""
    out: dict[tuple[str, int], bool] = {}
    for name, reports in groups.items():
        base = baselines.get(name)
        if base is None:
            continue
        for r in reports:
            out[(name, report_shard(r))] = not base.check(report_shard(r), headline_of(r.metrics))
    return out


def _render_set(groups: dict[str, list[ShardReport]], suite: SuiteLike, baselines: Mapping[str, Baseline], extras: Extras,
                repro: Reproduction | None, n_shards: int | None = None, card: CardInfo | None = None,
                not_measured: Sequence[NotMeasured] = ()) -> RenderedSet:
    """Every derived file of a published set (but the plot and checksums), from the shard reports,
    the suite and the baselines alone: ``publish`` writes these and ``verify`` re-derives them.
    ``not_measured``: configured candidates without a shard report (``candidate``, ``status``, ``reason``),
    recorded in ``results.json`` and listed under the ladder of ``ladder.md`` and the card."""
    shape = SuiteShape.of(suite)
    aggs = aggregate_groups(groups, n_shards=n_shards, suite=shape)
    verdicts = derive_verdicts(groups, baselines)
    rows = ladder_rows([r for g in groups.values() for r in g], verdicts, suite=shape)
    tails, window, pairs, adaptive = extras["tails"], extras["window"], extras["paired"], extras["adaptive"]
    floor = extras["floor"]
    annotate_floor(rows, floor)
    results = {
        "schema": SCHEMA_RESULTS,
        "suite": shape.to_json(),
        "n_shards_required": n_shards,
        "reproduction": repro,
        "card": card,
        "baselines": {name: (b.to_json() if (b := baselines.get(name)) is not None else None) for name in aggs},
        "candidates": {
            name: {"aggregate": aggs[name],
                   "verdict": next(r["verdict"] for r in rows if r["candidate"] == name),
                   "shards": [r.to_json_dict() for r in sorted(groups[name], key=lambda r: r.comparability["shard"]["index"])],
                   "tails": tails.get(name)}
            for name in aggs
        },
        "not_measured": [dict(m) for m in not_measured],
        "window": window,
        "paired": pairs,
        "adaptive": adaptive,
        "precision_floor": floor,
    }
    missing = not_measured_lines(not_measured)
    ladder_lines = format_ladder(rows) + ["", *ladder_notes(floor)] + ([""] + missing if missing else [])
    points = size_points(aggs)
    files: dict[str, str] = {
        "ladder.md": "# Fidelity ladder\n\n" + "\n".join(ladder_lines) + "\n",
        "results.json": dumps_json(results),
        "kld-vs-size.json": dumps_json({"schema": "fidelity.kld-vs-size/1", "x": "on-disk GiB", "y": "mean KLD (nats)", "points": points}),
    }
    for name, agg in aggs.items():
        mine = [p for p in pairs if name in (p["a"], p["b"])]
        files[f"{name}/report.md"] = render_candidate(name, agg, groups[name], tails.get(name), window, mine, repro)
    windows = sorted({a["score_from"] for a in aggs.values()})

    details = README.format(protocol=PROTOCOL_VERSION, windows=", ".join(map(str, windows)),
                            candidates=", ".join(f"`{n}`" for n in aggs))
    n_contexts = sum(s.stop - s.start for s in shape.shards)
    readme = render_card(card, aggs, {**shape.to_json(), "n_contexts": n_contexts}, ladder_lines, bool(tails), details)
    # the card first: verify names the last disagreement, and the card only repeats results.json's numbers
    return {"files": {"README.md": readme, **files}, "points": points, "floor": floor}


class NotMeasuredList(TypedDict):
    """A run's ``ladder.json`` as :func:`not_measured` reads it."""

    not_measured: list[NotMeasured]


def not_measured(reports_dir: Path, groups: Mapping[str, object], config: FidelityConfig | None = None) -> list[NotMeasured]:
    """Candidates without a shard report in ``reports_dir``: each one the run's ``ladder.json`` lists as not
    measured (with the status and reason the run recorded), and each configured one (``config``) it does not
    list (``not run``: no report in the folder). Sorted by name."""
    out: dict[str, NotMeasured] = {}
    lp = reports_dir / "ladder.json"
    if lp.is_file():
        doc = _read_json(lp)
        if isinstance(doc, dict) and "not_measured" in doc:
            for m in checked(doc, NotMeasuredList, lp)["not_measured"]:
                if m["candidate"] not in groups:
                    out[m["candidate"]] = {"candidate": m["candidate"], "status": m["status"], "reason": m["reason"]}
    for c in (config.candidates if config is not None else []):
        if c.name not in groups and c.name not in out:
            out[c.name] = {"candidate": c.name, "status": "not run", "reason": f"no shard report in {reports_dir}"}
    return [out[k] for k in sorted(out)]


def publish(reports_dir: str | Path, out_dir: str | Path, *, config: FidelityConfig | None = None, n_shards: int | None = None,
            suite: Suite | None = None, baselines_dir: str | Path | None = None) -> list[Path]:
    """Write the publishable set for the report folder ``reports_dir`` into ``out_dir``.

    The suite (``suite``, else ``config.suite``) is required: every report is checked against it.
    Verdicts are recomputed from the reports and the baselines (``baselines_dir``, else
    ``config.baselines``); the run's own ``ladder.json`` is never trusted. The set is built in a
    staging folder and moved into place whole.
    """
    reports_dir, out = Path(reports_dir), Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FidelityError(f"{out}: output folder exists and is not empty (a published set is written whole)")
    if suite is None and config is not None:
        suite = Suite.load(config.suite, verify=True)
    if suite is None:
        raise FidelityError(f"{reports_dir}: publish needs the suite the reports belong to: pass --suite DIR or --config fidelity.toml")
    if baselines_dir is None and config is not None:
        baselines_dir = config.baselines
    groups = load_reports([reports_dir])
    baselines = {}
    if baselines_dir is not None:
        for name in groups:
            bp = baseline_path(Path(baselines_dir), name)
            if bp.is_file():
                baselines[name] = Baseline.load(bp, name)
    extras: Extras = {
        "tails": _read_tails(reports_dir / "tails.json", groups),
        "window": _read_window(reports_dir / "window.json", groups, config),
        "adaptive": _read_adaptive(reports_dir / "adaptive.json", groups),
        "paired": [_read_paired(p, groups, config) for p in sorted((reports_dir / "paired").glob("*.json"))]
        if (reports_dir / "paired").is_dir() else [],
        "floor": matching_floor(reports_dir / "precision_floor.json",
                                next((r.comparability for g in groups.values() for r in g), None)),
    }

    derived = _render_set(groups, suite, baselines, extras, reproduction_info(config, groups), n_shards=n_shards,
                          card=card_info(config) if config is not None else None,
                          not_measured=not_measured(reports_dir, groups, config))
    with staged_directory(out) as stage:
        atomic_write_files({stage / rel: text for rel, text in derived["files"].items()})
        palette = None if config is None else [c.name for c in config.candidates]  # colours as in tails.png
        plot_kld_vs_size(derived["points"], stage / "kld-vs-size.png", palette,
                         None if derived["floor"] is None else derived["floor"]["kld"])
        if extras["tails"]:  # the card embeds it (colours as in the run's tails.png)

            plot_ccdf({n: t["ccdf"] for n, t in sorted(extras["tails"].items())}, stage / "tails.png", palette)
        write_checksums(stage)
    return [out / rel for rel in _files(out)] + [out / CHECKSUMS]


def _first_numeric_difference(want: object, got: object, where: str) -> tuple[str, object, object] | None:
    """The first place two JSON values differ (floats compared to 1e-9 relative: summation order)."""
    import math

    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got), key=str):
            if k not in want or k not in got:
                return (f"{where}.{k}", want.get(k, "<absent>"), got.get(k, "<absent>"))
            d = _first_numeric_difference(want[k], got[k], f"{where}.{k}")
            if d:
                return d
        return None
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return (f"{where} (length)", len(want), len(got))
        for i, (a, b) in enumerate(zip(want, got)):
            d = _first_numeric_difference(a, b, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(want, float) or isinstance(got, float):
        if isinstance(want, (int, float)) and isinstance(got, (int, float)) and not isinstance(want, bool) and not isinstance(got, bool) \
                and math.isclose(float(want), float(got), rel_tol=1e-9, abs_tol=1e-300):
            return None
        return (where, want, got)
    return None if want == got else (where, want, got)


def rederive_set(root: str | Path) -> list[str]:
    """Problems found by re-deriving a published set from the shard reports it holds: the
    aggregates, verdicts, ladder, plot points and pages must follow from the per-shard reports,
    the recorded suite and the recorded baselines. Each problem names the file and the figure."""
    root = Path(root)
    rp = root / "results.json"
    try:
        res = read_json(rp)
        suite = SuiteShape.from_json(res.get("suite"), rp)
        cands = res.get("candidates")
        if not isinstance(cands, dict) or not cands:
            raise VerificationError(rp, "candidates", "an object with at least one candidate", type(cands).__name__)
        groups: dict[str, list[ShardReport]] = {}
        for name, c in cands.items():
            if not isinstance(c, dict) or not isinstance(c.get("shards"), list):
                raise VerificationError(rp, f"candidates.{name}.shards", "an array of shard reports", type(c).__name__)
            reps = []
            for i, d in enumerate(c["shards"]):
                r = ShardReport.from_json_dict(d, f"{rp}: candidates.{name}.shards[{i}]")
                r.source = f"{rp}: candidates.{name}.shards[{i}]"
                reps.append(r)
            groups[name] = reps
        recorded = res.get("baselines") or {}
        if not isinstance(recorded, dict):
            raise VerificationError(rp, "baselines", "an object", type(recorded).__name__)
        baselines = {n: Baseline.from_json(b, rp, n) for n, b in recorded.items() if b is not None}
        tails: dict[str, TailReport] = {}
        for name, c in cands.items():
            if c.get("tails") is not None:
                check(c["tails"], REPORT_SCHEMA, rp, f"candidates.{name}.tails")
                tail = checked(c["tails"], TailReport, rp, f"candidates.{name}.tails")
                if tail["candidate"] != name:
                    raise VerificationError(rp, f"candidates.{name}.tails.candidate", name, tail["candidate"])
                verify_tail_report(tail, rp, f"candidates.{name}.tails", {report_shard(r): r.metrics for r in groups[name]})
                if c.get("tails"):
                    tails[name] = tail
        window = None
        if res.get("window") is not None:
            check(res["window"], WINDOW_SCHEMA, rp, "window")
            window = checked(res["window"], WindowComparison, rp, "window")
            verify_window(window, f"{rp}: window", _context_rows(groups))
        check(res.get("paired") or [], [object], rp, "paired")
        pairs: list[PairedReport] = []
        for i, raw in enumerate(res.get("paired") or []):
            check(raw, PAIRED_SCHEMA, rp, f"paired[{i}]")
            pairs.append(checked(raw, PairedReport, rp, f"paired[{i}]"))
            _check_paired(pairs[-1], f"{rp}: paired[{i}]", groups)
        floor = res.get("precision_floor")
        extras: Extras = {"tails": tails, "window": window, "paired": pairs, "adaptive": res.get("adaptive"),
                          "floor": None if floor is None else checked(floor, FloorRecord, rp, "precision_floor")}
        if extras["adaptive"] is not None:
            check_adaptive(extras["adaptive"], f"{rp}: adaptive", _context_rows(groups))
        required = res.get("n_shards_required")
        if required is not None and (isinstance(required, bool) or not isinstance(required, int)):
            raise VerificationError(rp, "n_shards_required", "an integer or null", required)
        repro = res.get("reproduction")
        if repro is not None and not isinstance(repro, dict):
            raise VerificationError(rp, "reproduction", "an object or null", type(repro).__name__)
        card = res.get("card")
        if card is not None and not isinstance(card, dict):
            raise VerificationError(rp, "card", "an object or null", type(card).__name__)
        missing = checked({"not_measured": res.get("not_measured") or []}, NotMeasuredList, rp)["not_measured"]
        repro = None if repro is None else checked(repro, Reproduction, rp, "reproduction")
        card = None if card is None else checked(card, CardInfo, rp, "card")
        derived = _render_set(groups, suite, baselines, extras, repro, n_shards=required, card=card, not_measured=missing)
    except FidelityError as e:
        return [f"re-deriving the set from its shard reports failed: {e}"]
    problems = []
    for rel, text in derived["files"].items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{path}: missing (re-derived from the shard reports)")
            continue
        if rel == "README.md":  # a model card: its metadata compared as data, its body as text

            (want_meta, text), (got_meta, found) = split_card(text), split_card(path.read_text(encoding="utf-8"))
            diff = _first_numeric_difference(want_meta, got_meta, "metadata")
            if diff:
                problems.append(f"{path}: {diff[0]}: expected {diff[1]!r} (re-derived from the shard reports), found {diff[2]!r}")
                continue
        else:
            found = path.read_text(encoding="utf-8")
        if rel.endswith(".json"):
            want, got = json.loads(text), read_json(path)
            diff = _first_numeric_difference(want, got, "$")
            if diff:
                problems.append(f"{path}: {diff[0]}: expected {diff[1]!r} (re-derived from the shard reports), found {diff[2]!r}")
        elif found != text:
            want_lines, got_lines = text.splitlines(), found.splitlines()
            n = next((i for i, (a, b) in enumerate(zip(want_lines, got_lines)) if a != b), min(len(want_lines), len(got_lines)))
            problems.append(f"{path}:{n + 1}: expected {want_lines[n] if n < len(want_lines) else '<end>'!r} "
                            f"(re-derived from the shard reports), found {got_lines[n] if n < len(got_lines) else '<end>'!r}")
    return problems
