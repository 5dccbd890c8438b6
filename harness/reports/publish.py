"""Aggregation of report folders and the publishable report set (``fidelity aggregate``,
``fidelity publish``, ``fidelity verify``).

A *report folder* is what a pytest run (``--fidelity-report-dir``) or ``fidelity replay`` writes:
``<candidate>/shard-NN.json`` shard reports, and optionally ``tails.json``, ``window.json``,
``adaptive.json`` and ``paired/*.json``. Several folders (say, two machines that ran different
shards) may be passed together: their shard reports are grouped per candidate and each group is
aggregated under the fail-closed rules of :mod:`harness.reports.aggregate`.

The publishable set (``fidelity publish``)::

    README.md            the protocol in brief and how to verify the set
    ladder.md            one row per candidate, sorted by mean KLD
    results.json         every measurement: aggregates, every shard report, tails, windows, pairs
    kld-vs-size.json     the points of the plot (on-disk GiB, mean KLD, interval, Pareto flag)
    kld-vs-size.png      mean KLD (log) versus size, interval bars, Pareto frontier, labels
    <candidate>/report.md  one page per candidate
    checksums.txt        sha256 of every other file (``sha256sum -c`` compatible)

``fidelity verify DIR`` re-hashes the set and refuses a changed, missing or extra file.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.io.atomic import atomic_write_json, atomic_write_text
from harness.reports.numbers import fmt_opt
from harness.errors import FidelityError, VerificationError

SCHEMA_RESULTS = "fidelity.results/1"
CHECKSUMS = "checksums.txt"
GIB = 2**30


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


def load_reports(paths: Iterable[str | Path]) -> dict[str, list[Any]]:
    """Shard reports grouped per candidate (each report remembers its file as ``source``)."""
    from harness.reports.shard import ShardReport

    groups: dict[str, list[Any]] = {}
    for f in find_shard_reports(paths):
        r = ShardReport.load(f)
        r.source = str(f)  # type: ignore[attr-defined]  # named in fail-closed errors
        groups.setdefault(r.candidate, []).append(r)
    return dict(sorted(groups.items()))


def aggregate_groups(groups: dict[str, list[Any]], *, n_shards: int | None = None, suite: Any = None) -> dict[str, dict[str, Any]]:
    """Aggregate each candidate's reports (fail closed); ``suite`` also checks the suite hash."""
    from harness.reports.aggregate import aggregate

    out = {}
    for name, reports in groups.items():
        if suite is not None:
            for r in reports:
                found = r.comparability["suite_token_sha256"]
                if found != suite.suite_token_sha256:
                    raise VerificationError(r.source, "comparability.suite_token_sha256", suite.suite_token_sha256, found,
                                            f"the report is not of suite {suite.root}")
        out[name] = aggregate(reports, n_shards=n_shards)
    return out


def write_aggregates(out_dir: str | Path, groups: dict[str, list[Any]], aggs: dict[str, dict[str, Any]]) -> list[Path]:
    """``<out>/<candidate>/aggregate.json`` per candidate plus ``ladder.md``/``ladder.json``."""
    from harness.reports.aggregate import ladder_rows, write_ladder

    out = Path(out_dir)
    paths = []
    for name, agg in aggs.items():
        p = out / name / "aggregate.json"
        atomic_write_json(p, agg)
        paths.append(p)
    rows = ladder_rows([r for g in groups.values() for r in g])
    write_ladder(out, rows)
    return paths + [out / "ladder.md", out / "ladder.json"]


def _read_json(path: Path) -> Any:
    from harness.io.jsonio import read_json

    if not path.is_file():
        return None
    return read_json(path)


# ------------------------------------------------------------------ the publishable set
def size_points(aggs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Points of the KLD-versus-size plot, with the Pareto flag (smaller and closer than all others)."""
    from harness.reports.plot import pareto_front

    pts = []
    for name, a in aggs.items():
        size = a["comparability"]["candidate"].get("size_bytes")
        pts.append({"candidate": name, "size_bytes": size, "size_gib": None if not size else size / GIB,
                    "mean_kld": a["kld"]["mean"], "ci95": a["kld"]["ci95"]})
    front = {n for _, _, n in pareto_front([(p["size_gib"], p["mean_kld"], p["candidate"]) for p in pts if p["size_gib"]])}
    for p in pts:
        p["pareto"] = p["candidate"] in front
    return sorted(pts, key=lambda p: (p["size_gib"] is None, p["size_gib"] or 0.0, p["candidate"]))


def _size(size: int | None) -> str:
    if not size:
        return "—"
    return f"{size / GIB:.3f} GiB ({size} bytes)" if size >= GIB // 100 else f"{size / 2**20:.3f} MiB ({size} bytes)"


def _reproduce(name: str, agg: dict[str, Any], config: Any) -> list[str]:
    shards = ",".join(str(s["index"]) for s in agg["shards"])
    window = agg["score_from"]
    cfg = f" --fidelity-config {shlex.quote(config.path.name)}" if config is not None else ""
    lines = ["```sh", f"pytest fidelity_tests -k {name}{cfg} --fidelity-shards {shards}"
             + (f" --fidelity-window {window}" if window else "") + " --fidelity-report-dir reports",
             f"fidelity aggregate reports/{name} --out aggregate/", "```"]
    if config is not None:
        try:
            cand = config.candidate(name)
        except FidelityError:
            cand = None
        if cand is not None and cand.store is not None:
            lines += ["", "or, from the stored captures:", "", "```sh",
                      f"fidelity replay --suite {config.suite} --reference {config.reference.store} "
                      f"--candidate {cand.store} --head {config.reference.head} --out reports/{name}", "```"]
    return lines


def render_candidate(name: str, agg: dict[str, Any], shards: Sequence[Any], tails: dict[str, Any] | None,
                     window: dict[str, Any] | None, pairs: Sequence[dict[str, Any]], config: Any) -> str:
    """One page: headline, interval, tails, window control, pairs, identity, how to reproduce."""
    k = agg["kld"]
    lo, hi = k["ci95"]
    comp = agg["comparability"]
    size = comp["candidate"].get("size_bytes")
    shard_list = ", ".join(f"{s['index']:02d}" for s in agg["shards"])
    lines = [f"# {name}", "",
             f"**Mean KLD {fmt_opt(k['mean'])} nats** (95% interval [{fmt_opt(lo)}, {fmt_opt(hi)}], source-cluster bootstrap, "
             f"{agg['bootstrap']['n_boot']} replicates, seed {agg['bootstrap']['seed']}) against "
             f"`{comp['reference']['name']}`, over {agg['n_positions']} positions in {agg['n_contexts']} contexts "
             f"({agg['n_clusters']} source clusters), shards {shard_list}, "
             f"score_from={agg['score_from']}.", "",
             "| metric | value |", "|---|---|",
             f"| top-1 agreement | {agg['top1']['agreement']:.4f} [{agg['top1']['ci95'][0]:.4f}, {agg['top1']['ci95'][1]:.4f}] |",
             f"| EAR | {fmt_opt(agg['ear']['mean'])} |",
             f"| mean JSD (bits) | {fmt_opt(agg['jsd_bits']['mean'])} |",
             f"| PPL ref / cand | {agg['ppl']['ref']:.4f} / {agg['ppl']['cand']:.4f} |",
             f"| max KLD | {fmt_opt(k['max'])} |",
             f"| on-disk size | {_size(size)} |", ""]
    lines += ["## Tails", ""]
    if tails:
        cum = tails["cumulative"]
        lines += ["| | p50 | p90 | p99 | p99.9 | CVaR1% | max |", "|---|---|---|---|---|---|---|",
                  "| exact (all positions) | " + " | ".join(fmt_opt(cum["percentiles"][p]) for p in ("p50", "p90", "p99", "p99.9"))
                  + f" | {fmt_opt(cum['cvar1'])} | {fmt_opt(cum['max'])} |", ""]
    else:
        lines += ["Bin-bounded percentiles from the summed histograms (exact tails: run `pytest -m tails`):", "",
                  "| percentile | bracket (nats) |", "|---|---|"]
        lines += [f"| {q} | [{fmt_opt(b[0])}, {fmt_opt(b[1])}] |" for q, b in k["quantile_bounds"].items()]
        lines.append("")
    lines += ["Exceedance counts (exact): " + ", ".join(f"KLD > {t}: {c}" for t, c in agg["exceedance"].items()) + ".", ""]
    if window:
        lines += ["## Scoring-window control", "", f"Verdict: {window['verdict']}.", "", "| score_from | mean KLD | change |", "|---|---|---|"]
        for kk, w in sorted(window["windows"].items(), key=lambda t: int(t[0])):
            d = w["candidates"].get(name)
            if d:
                rel = "—" if d["rel_change_mean_kld"] is None else f"{100 * d['rel_change_mean_kld']:+.1f}%"
                lines.append(f"| {kk} | {fmt_opt(d['mean_kld'])} | {rel} |")
        lines.append("")
    if pairs:
        lines += ["## Paired comparisons", ""]
        for p in pairs:
            plo, phi = p["kld_mean"]["ci95"]
            lines.append(f"- {p['a']} vs {p['b']}: **{p['verdict_named']}** (difference {fmt_opt(p['kld_mean']['diff'])}, "
                         f"95% [{fmt_opt(plo)}, {fmt_opt(phi)}], margin ±{p['margin']:g})")
        lines.append("")
    lines += ["## Identity", "", "| field | value |", "|---|---|"]
    for key in ("protocol_version", "harness_version", "suite_token_sha256", "reference", "candidate", "head_sha256",
                "cand_head_sha256", "engine", "scorer"):
        lines.append(f"| {key} | `{json.dumps(comp.get(key), sort_keys=True)}` |")
    lines += ["", "Shard hashes: " + ", ".join(f"{s['index']:02d} `{s['sha256'][:16]}…`" for s in agg["shards"]) + ".", "",
              "## How to reproduce", ""] + _reproduce(name, agg, config) + [""]
    return "\n".join(lines)


README = """\
# Fidelity report set

Exact full-vocabulary KL divergence KL(p‖q) of each candidate's next-token distribution (q)
from the BF16 reference's (p), in nats, on a fixed suite of token contexts. Both models' final
hidden states go through one shared BF16 LM head, so the number measures the model body.

## Protocol (version {protocol})

* Suite: fixed token ids (never re-tokenized), `n_ctx` tokens per context; rows `score_from .. n_ctx-2`
  of every context are scored (this set: score_from = {windows}).
* Per position: KLD, top-1 agreement, EAR = Σ min(p, q), JSD, NLL of the true next token.
* Headline: token-mean KLD with a 95% **source-cluster bootstrap** percentile interval
  (whole source documents resampled; fixed seed).
* Tails: exact per-shard percentiles; cumulative percentiles are bracketed by a fixed
  log-spaced histogram (40 bins per decade) whose counts add across shards; exceedance counts
  are exact.
* Paired comparisons: common-random-number bootstrap of the difference; verdict `equivalent`
  when the interval lies within ±margin.

## Files

| file | content |
|---|---|
| `ladder.md` | one row per candidate, sorted by mean KLD |
| `results.json` | every measurement: aggregates, every shard report, tails, windows, pairs |
| `kld-vs-size.json`, `kld-vs-size.png` | mean KLD (log scale, interval bars) versus on-disk GiB, Pareto frontier |
| `<candidate>/report.md` | one page per candidate: headline, interval, tails, window control, identity, how to reproduce |
| `checksums.txt` | sha256 of every other file |

## Verify

```sh
fidelity verify .          # refuses a changed, missing or extra file
sha256sum -c checksums.txt # the same check with coreutils (does not detect extra files)
```

Candidates: {candidates}.
"""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != CHECKSUMS)


def write_checksums(root: str | Path) -> Path:
    """``checksums.txt``: ``<sha256>  <relative path>`` per file, sorted (``sha256sum -c`` format)."""
    root = Path(root)
    text = "".join(f"{_sha256(root / rel)}  {rel}\n" for rel in _files(root))
    atomic_write_text(root / CHECKSUMS, text)
    return root / CHECKSUMS


def verify_set(root: str | Path) -> list[str]:
    """Problems of a published set (empty: intact): changed, missing or extra files, bad lines."""
    root = Path(root)
    listing = root / CHECKSUMS
    if not listing.is_file():
        return [f"{listing}: missing (not a published set, or the listing was removed)"]
    problems, listed = [], set()
    for n, line in enumerate(listing.read_text(encoding="utf-8").splitlines(), 1):
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
        elif (found := _sha256(root / rel)) != sha:
            problems.append(f"{root / rel}: sha256: expected {sha}, found {found} (changed)")
    for rel in _files(root):
        if rel not in listed:
            problems.append(f"{root / rel}: extra file (not listed in {CHECKSUMS})")
    return problems


def publish(reports_dir: str | Path, out_dir: str | Path, *, config: Any = None, n_shards: int | None = None) -> list[Path]:
    """Write the publishable set for the report folder ``reports_dir`` into ``out_dir``."""
    from harness import PROTOCOL_VERSION
    from harness.reports.aggregate import format_ladder, ladder_rows
    from harness.reports.plot import plot_kld_vs_size

    reports_dir, out = Path(reports_dir), Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FidelityError(f"{out}: output folder exists and is not empty (a published set is written whole)")
    groups = load_reports([reports_dir])
    aggs = aggregate_groups(groups, n_shards=n_shards)
    tails_doc = _read_json(reports_dir / "tails.json") or {}
    tails = {t["candidate"]: t for t in tails_doc.get("candidates", [])}
    window = _read_json(reports_dir / "window.json")
    adaptive = _read_json(reports_dir / "adaptive.json")
    pairs = [_read_json(p) for p in sorted((reports_dir / "paired").glob("*.json"))] if (reports_dir / "paired").is_dir() else []
    rows = ladder_rows([r for g in groups.values() for r in g])
    run_ladder = _read_json(reports_dir / "ladder.json") or {}  # the run's baseline verdicts, when present
    verdicts = {r.get("candidate"): r.get("verdict") for r in run_ladder.get("rows", [])}
    for row in rows:
        if verdicts.get(row["candidate"]) and row["shards"] == next(
                (r.get("shards") for r in run_ladder["rows"] if r.get("candidate") == row["candidate"]), None):
            row["verdict"] = verdicts[row["candidate"]]
    atomic_write_text(out / "ladder.md", "# Fidelity ladder\n\n" + "\n".join(format_ladder(rows)) + "\n")
    results = {
        "schema": SCHEMA_RESULTS,
        "candidates": {
            name: {"aggregate": aggs[name],
                   "shards": [r.to_json_dict() for r in sorted(groups[name], key=lambda r: r.comparability["shard"]["index"])],
                   "tails": tails.get(name)}
            for name in aggs
        },
        "window": window,
        "paired": pairs,
        "adaptive": adaptive,
    }
    atomic_write_json(out / "results.json", results)
    points = size_points(aggs)
    atomic_write_json(out / "kld-vs-size.json", {"schema": "fidelity.kld-vs-size/1", "x": "on-disk GiB",
                                                 "y": "mean KLD (nats)", "points": points})
    plot_kld_vs_size(points, out / "kld-vs-size.png")
    for name, agg in aggs.items():
        mine = [p for p in pairs if name in (p["a"], p["b"])]
        atomic_write_text(out / name / "report.md", render_candidate(name, agg, groups[name], tails.get(name), window, mine, config))
    windows = sorted({a["score_from"] for a in aggs.values()})
    atomic_write_text(out / "README.md", README.format(protocol=PROTOCOL_VERSION, windows=", ".join(map(str, windows)),
                                                       candidates=", ".join(f"`{n}`" for n in aggs)))
    write_checksums(out)
    return [out / rel for rel in _files(out)] + [out / CHECKSUMS]
