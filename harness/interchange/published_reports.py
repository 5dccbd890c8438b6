"""``fidelity aggregate`` and ``fidelity paired`` over published reports (``qwen38-fidelity-report/1..3``).

Nothing is re-scored: the numbers come from the reports' complete per-context rows
(``per_context_all``). Refused, naming the file: reports of two methods (``fidelity_method``: a
report without it was made by the published tool, bf16-rounded logits) or of two windows; reports
that disagree on the head, the filter, the reference's or the candidate's recorded identity; a context
in two reports; a report whose ``suite_token_sha256`` is not the published digest of exactly the
contexts it scored, in suite order (a report of another suite); a context the suite lacks, or one
whose source cluster differs from the suite's; summed tails of different edges.

Reasoning: docs/interchange.md §"Reading published reports".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import VerificationError
from harness.interchange.bootstrap_method import percentile_bootstrap
from harness.interchange.report_format import PublishedReport, read_published_report
from harness.interchange.suite_manifest import ids_digest, published_digest

if TYPE_CHECKING:
    from harness.inputs.suite import Suite

SCHEMA_AGGREGATE = "fidelity.published-aggregate/1"
SCHEMA_PAIRED = "fidelity.published-paired/1"
#: Report fields that must agree across the reports of one aggregate or pair.
SHARED = ("head_sha256", "candidate_head_sha256", "filter")
IDENTITY = ("model_revision", "index_sha256", "config_sha256", "shard_sha256", "quantization", "kv_cache_dtype_resolved")


def report_paths(items: Sequence[Path]) -> list[Path]:
    """Files as given; folders searched for ``report-*.json`` (recursively), sorted."""
    out: list[Path] = []
    for p in items:
        out.extend(sorted(p.rglob("report-*.json")) if p.is_dir() else [p])
    return out


def is_published_report(path: Path) -> bool:
    """True when ``path`` is a JSON object whose ``schema`` is a published report's."""
    import json

    if path.suffix != ".json" or not path.is_file():
        return False
    try:
        doc = json.loads(path.read_bytes())
    except ValueError:
        return False
    return isinstance(doc, dict) and str(doc.get("schema", "")).startswith("qwen38-fidelity-report/")


def _identity(doc: dict[str, Any], side: str) -> dict[str, Any]:
    block = doc.get(side)
    return {k: block.get(k) for k in IDENTITY} if isinstance(block, dict) else dict.fromkeys(IDENTITY)


def _same(reports: Sequence[PublishedReport], with_candidate: bool) -> None:
    first = reports[0]
    for r in reports[1:]:
        if r.method != first.method:
            raise VerificationError(r.path, "method (fidelity_method.name; none: the published tool's)", first.method, r.method,
                                    f"differs from {first.path}: figures of two methods are never combined")
        if r.score_from != first.score_from:
            raise VerificationError(r.path, "scored_position_window.score_from", first.score_from, r.score_from,
                                    f"differs from {first.path}: two windows are two measurements")
        for key in SHARED:
            if r.doc.get(key) != first.doc.get(key):
                raise VerificationError(r.path, key, first.doc.get(key), r.doc.get(key), f"differs from {first.path}")
        sides = ("reference_identity", "candidate_identity") if with_candidate else ("reference_identity",)
        for side in sides:
            if _identity(r.doc, side) != _identity(first.doc, side):
                raise VerificationError(r.path, side, _identity(first.doc, side), _identity(r.doc, side), f"differs from {first.path}")


def check_against_suite(report: PublishedReport, suite: Suite) -> None:
    """The report's contexts are the suite's (index, cluster) and its digest is theirs, in suite order."""
    idx = sorted(int(r["index"]) for r in report.rows)
    bad = [i for i in idx if not 0 <= i < suite.n_contexts]
    if bad:
        raise VerificationError(report.path, "per_context_all indices (contexts of the suite)", f"0..{suite.n_contexts - 1}", bad[:5])
    for r in report.rows:
        want = str(suite.contexts[int(r["index"])].source_cluster)
        if str(r["source_cluster"]) != want:
            raise VerificationError(report.path, f"source_cluster of context {r['index']} (the suite's)", want, r["source_cluster"])
    digest = published_digest([ids_digest([int(t) for t in suite.tokens[i]]) for i in idx])
    if report.doc["suite_token_sha256"] != digest:
        raise VerificationError(report.path, "suite_token_sha256 (the published digest of its contexts in this suite)", digest,
                                report.doc["suite_token_sha256"], "a report of another suite")


def aggregate_published(paths: Sequence[Path], suite: Suite | None = None) -> dict[str, Any]:
    """Aggregate one candidate's published reports (docs/interchange.md §"Reading published reports")."""
    reports = [read_published_report(p) for p in paths]
    if not reports:
        raise VerificationError("<none>", "reports", "at least one qwen38-fidelity-report", "none")
    _same(reports, with_candidate=True)
    if suite is None and len({r.doc["suite_token_sha256"] for r in reports}) > 1:
        raise VerificationError(reports[1].path, "suite_token_sha256 (without --suite, one digest for all)",
                                reports[0].doc["suite_token_sha256"], reports[1].doc["suite_token_sha256"])
    owner: dict[int, Path] = {}
    rows: list[dict[str, Any]] = []
    for r in reports:
        if suite is not None:
            check_against_suite(r, suite)
        for row in r.rows:
            i = int(row["index"])
            if i in owner:
                raise VerificationError(r.path, f"context {i}", "in one report only", f"also in {owner[i]}")
            owner[i] = r.path
            rows.append(row)
    rows.sort(key=lambda x: int(x["index"]))
    n = sum(int(x["positions_scored"]) for x in rows)
    means = [float(x["mean_kld"]) for x in rows]
    tails = [r.tail for r in reports if r.tail is not None]
    tail: dict[str, Any] | None = None
    if len(tails) == len(reports):
        edges = tails[0]["bin_edges"]
        for r, t in zip(reports, tails):
            if t["bin_edges"] != edges:
                raise VerificationError(r.path, "kld_tail.bin_edges", "those of the first report", "other edges")
        counts = [sum(int(t["counts"][k]) for t in tails) for k in range(len(edges) + 1)]
        tail = {"bin_edges": edges, "counts": counts, "total_count": sum(counts),
                "max_kld": max(float(t["max_kld"]) for t in tails)}
    first = reports[0].doc
    return {
        "schema": SCHEMA_AGGREGATE, "method": reports[0].method, "score_from": reports[0].score_from,
        "candidate": first.get("candidate"), "head_sha256": first.get("head_sha256"),
        "reports": [{"path": str(r.path), "suite_token_sha256": r.doc["suite_token_sha256"], "contexts": len(r.rows)} for r in reports],
        "contexts": len(rows), "scored_positions": n,
        "token_mean_kld": math.fsum(float(x["mean_kld"]) * int(x["positions_scored"]) for x in rows) / n,
        "top1_agreement": math.fsum(float(x["top1_agreement"]) * int(x["positions_scored"]) for x in rows) / n,
        "context_macro_mean_kld": statistics.fmean(means),
        "context_bootstrap": percentile_bootstrap(means, [x["source_cluster"] for x in rows]),
        "max_kld": None if tail is None else tail["max_kld"], "kld_tail": tail,
    }


def paired_published(a: Sequence[Path], b: Sequence[Path], suite: Suite | None = None) -> dict[str, Any]:
    """A minus B over the contexts both report sets scored (docs/interchange.md §"Reading published reports")."""
    ra = [read_published_report(p) for p in a]
    rb = [read_published_report(p) for p in b]
    if not ra or not rb:
        raise VerificationError("<none>", "reports of both sides", "at least one each", f"{len(ra)} and {len(rb)}")
    _same(ra + rb, with_candidate=False)
    if suite is not None:
        for r in ra + rb:
            check_against_suite(r, suite)
    side: list[dict[int, dict[str, Any]]] = []
    for reps in (ra, rb):
        rows: dict[int, dict[str, Any]] = {}
        for r in reps:
            for row in r.rows:
                if int(row["index"]) in rows:
                    raise VerificationError(r.path, f"context {row['index']}", "in one report only", "twice")
                rows[int(row["index"])] = row
        side.append(rows)
    if set(side[0]) != set(side[1]):
        only = sorted(set(side[0]) ^ set(side[1]))[:8]
        raise VerificationError(ra[0].path, "contexts (the same set on both sides)", "equal sets", f"differ at {only}")
    shared = sorted(side[0])
    for i in shared:
        if side[0][i]["source_cluster"] != side[1][i]["source_cluster"]:
            raise VerificationError(rb[0].path, f"source_cluster of context {i}", side[0][i]["source_cluster"], side[1][i]["source_cluster"])
    diffs = [float(side[0][i]["mean_kld"]) - float(side[1][i]["mean_kld"]) for i in shared]
    boot = percentile_bootstrap(diffs, [side[0][i]["source_cluster"] for i in shared])
    return {
        "schema": SCHEMA_PAIRED, "method": ra[0].method, "score_from": ra[0].score_from,
        "a": {"candidate": ra[0].doc.get("candidate"), "reports": [str(r.path) for r in ra]},
        "b": {"candidate": rb[0].doc.get("candidate"), "reports": [str(r.path) for r in rb]},
        "contexts": len(shared), "difference_a_minus_b": statistics.fmean(diffs),
        "ci95_low": boot["ci95_low"], "ci95_high": boot["ci95_high"], "clusters": boot["clusters"],
        "a_wins": sum(d < 0 for d in diffs), "b_wins": sum(d > 0 for d in diffs), "ties": sum(d == 0 for d in diffs),
    }
