"""Aggregation of one candidate's shard reports into a ladder entry (fail closed).

Reasoning: docs/reports.md §"Aggregation".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np

from harness.errors import VerificationError
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.jsonio import read_json
from harness.io.md_table import md_table
from harness.io.schema import checked
from harness.metrics.bootstrap import (
    MEAN_METHOD,
    MIN_CLUSTERS,
    SideReading,
    draw_cluster_weights,
    method_text,
    ratio_intervals_read,
)
from harness.metrics.diagnostics import diagnostics_from_totals
from harness.metrics.histogram import LogHistogram
from harness.metrics.records import (
    ContextRow,
    Diagnostics,
    HistogramJSON,
    MeanCI,
    SideLevels,
    StratumRow,
    TopOne,
    Totals,
)
from harness.metrics.summary import merge_totals
from harness.reports.plot import FloorBand
from harness.reports.shard import SetComparability, ShardRef, check_finite, set_comparability
from harness.reports.suite_shape import SuiteJSON, SuiteLike, SuiteShape
from harness.reports.units import bpw_text, size_text

if TYPE_CHECKING:
    from harness.reports.shard import ShardReport

SCHEMA = "fidelity.aggregate/1"
QUANTILES = (0.5, 0.9, 0.99, 0.999, 0.9999)
_REL_TOL = 1e-9


class AggregateKld(TypedDict):
    """The aggregate's KLD: exact mean, its 95% interval (None: not estimable), the exact max, and the
    bin-bounded quantiles ``[lo, hi]`` by name (``p50`` ... ``p99.99``)."""

    mean: float
    ci95: list[float] | None
    max: float
    quantile_bounds: dict[str, list[float]]


class MeanOnly(TypedDict):
    """A position-weighted mean without an interval (JSD)."""

    mean: float


class AggregatePpl(TypedDict):
    """Perplexities of both models over all positions, and the mean log ratio."""

    ref: float
    cand: float
    mean_ln_ratio: float


class AggregateDeltaP(TypedDict):
    """Δp = q(y) − p(y) over all positions: mean and root mean square."""

    mean: float
    rms: float


class AggregateBootstrap(TypedDict):
    """How the aggregate's intervals were drawn (over the per-context rows of every shard)."""

    method: str
    method_text: str  # with the dominance warning where it fired on the KLD
    levels: NotRequired[dict[str, SideLevels]]  # per mean: how its interval was read (absent: older aggregates)
    level_guaranteed: NotRequired[bool]  # False: the dominance diagnostic fired on the KLD
    min_clusters: int
    n_boot: int
    seed: int


class Aggregate(TypedDict):
    """One candidate's shard reports combined (``fidelity.aggregate/1``; module docstring)."""

    schema: str
    candidate: str
    comparability: SetComparability
    shards: list[ShardRef]
    #: a complete set was asked for (every shard of the suite present)
    complete: bool
    n_positions: int
    n_contexts: int
    n_clusters: int
    score_from: int
    kld: AggregateKld
    top1: TopOne
    ear: MeanCI
    jsd_bits: MeanOnly
    ppl: AggregatePpl
    delta_p: AggregateDeltaP
    exceedance: dict[str, int]
    histogram: HistogramJSON
    per_stratum: dict[str, StratumRow]
    #: absent when a report of the set predates the diagnostics
    diagnostics: NotRequired[Diagnostics]
    bootstrap: AggregateBootstrap
    #: the suite every report was checked against (absent when none was given)
    suite: NotRequired[SuiteJSON]


class LadderLine(TypedDict):
    """What a ladder table shows of one candidate (:func:`format_ladder`): rows of :func:`ladder_rows`, or of
    published receipts."""

    candidate: str
    #: on-disk bytes (None when unknown)
    size_bytes: int | None
    shards: list[int]
    n_positions: int
    mean_kld: float
    ci95: list[float] | None
    #: the p99 bracket ``[lo, hi]``
    p99_bounds: list[float]
    top1: float
    #: "pass", "FAIL (k/n)", "no baseline" or "—" (no verdict)
    verdict: str
    #: the candidate's bits per weight as its reports record them (:func:`harness.reports.units.bpw_text`)
    bits_per_weight: NotRequired[object]
    #: set by :func:`annotate_floor`: mean KLD / the precision floor's mean (None: a floor of 0)
    floor_ratio: NotRequired[float | None]
    #: set by :func:`annotate_floor`: :data:`INDISTINGUISHABLE` or "above the floor"
    vs_floor: NotRequired[str]


class LadderRow(LadderLine):
    """One candidate of a measured ladder (:func:`ladder_rows`): the table's fields, the diagnostics beside the
    headline (absent for reports that predate them), the resolvable difference and the whole aggregate."""

    max_kld: float
    resolvable_delta: float | None
    aggregate: Aggregate
    kld_rev_mean: NotRequired[float]
    kld_rev_ci95: NotRequired[list[float] | None]
    top5_overlap: NotRequired[float]
    top10_overlap: NotRequired[float]
    same_top: NotRequired[float]
    q_ref_top_mean: NotRequired[float]


class NotMeasured(TypedDict):
    """A configured candidate without a shard report: its name, ``failed`` / ``skipped`` / ``not run``, and why."""

    candidate: str
    status: str
    reason: str


class FloorSuite(TypedDict):
    """The suite and shards a precision floor measured."""

    suite_token_sha256: str
    shards: list[int]


class FloorReference(TypedDict):
    """The reference a precision floor measured (its identity by content)."""

    identity: object


class FloorCompute(TypedDict):
    """The higher-precision compute of a precision floor."""

    dtype: str


class FloorSample(TypedDict):
    """How a precision floor's contexts were chosen, in words."""

    text: str


class FloorRecord(TypedDict):
    """What a ladder reads of a precision floor (``fidelity.precision-floor/1``, written by
    :mod:`harness.run.precision_floor`; its other fields travel along untouched)."""

    schema: str
    definition: str
    suite: FloorSuite
    reference: FloorReference
    kld: FloorBand
    compute: FloorCompute
    n_positions: int
    score_from: NotRequired[int]
    sample: NotRequired[FloorSample]


def _name(report: ShardReport) -> str:
    return report.source or f"{report.candidate} shard {_shard(report):02d}"


def _shard(report: ShardReport) -> int:
    return int(report.comparability["shard"]["index"])


def _first_difference(a: Mapping[str, object], b: Mapping[str, object], prefix: str = "") -> tuple[str, object, object] | None:
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            d = _first_difference(va, vb, f"{prefix}{key}.")
            if d:
                return d
        elif va != vb:
            return (f"{prefix}{key}", va, vb)
    return None


def check_comparable(reports: Sequence[ShardReport]) -> None:
    """Refuse reports that may not be combined (see docs/reports.md §"Aggregation")."""
    if not reports:
        raise VerificationError("<aggregate>", "reports", "at least one shard report", "none")

    for r in reports:
        check_finite(r.to_json_dict(), _name(r))
    first = reports[0]
    base = set_comparability(first.comparability)
    for r in reports[1:]:
        if r.schema != first.schema:
            raise VerificationError(_name(r), "schema", first.schema, r.schema, f"differs from {_name(first)}")
        if r.candidate != first.candidate:
            raise VerificationError(_name(r), "candidate", first.candidate, r.candidate, "one candidate per aggregate")
        other = set_comparability(r.comparability)
        diff = _first_difference(base, other)
        if diff:
            key, va, vb = diff
            raise VerificationError(_name(r), f"comparability.{key}", va, vb, f"differs from {_name(first)}; reports that differ may not be combined")
        if r.metrics["histogram"]["spec"] != first.metrics["histogram"]["spec"]:
            raise VerificationError(_name(r), "histogram spec", first.metrics["histogram"]["spec"], r.metrics["histogram"]["spec"])
    seen_shards: dict[int, str] = {}
    seen_ctx: dict[int, str] = {}
    for r in reports:
        s = _shard(r)
        if s in seen_shards:
            raise VerificationError(_name(r), f"shard {s:02d}", "each shard once", f"also in {seen_shards[s]}")
        seen_shards[s] = _name(r)
        for row in r.metrics["contexts"]:
            i = int(row["index"])
            if i in seen_ctx:
                raise VerificationError(_name(r), f"context {i}", "each context in one report", f"overlaps {seen_ctx[i]}")
            seen_ctx[i] = _name(r)
        check_rows_match_summary(r)


def _close(a: float, b: float, scale: float) -> bool:
    """Equal up to float summation order (``scale``: the magnitude the sums are built from)."""
    return math.isclose(a, b, rel_tol=1e-7, abs_tol=1e-9 * max(scale, 1.0))


def check_rows_match_summary(report: ShardReport) -> None:
    """A report's per-context rows, its additive totals and its headline must tell one story:
    the totals are what aggregation adds, so a total that disagrees with the rows is refused."""
    m = report.metrics
    rows = m["contexts"]
    t = m["totals"]
    name = _name(report)
    n = int(m["n_positions"])
    counts = [
        ("metrics.n_positions", n, sum(int(r["positions"]) for r in rows)),
        ("metrics.top1.count", int(m["top1"]["count"]), sum(int(r["top1"]) for r in rows)),
        ("metrics.n_contexts", int(m["n_contexts"]), len(rows)),
        ("metrics.totals.n_positions", n, int(t["n_positions"])),
        ("metrics.totals.top1_count", int(m["top1"]["count"]), int(t["top1_count"])),
        ("metrics.histogram total", n, int(sum(t["histogram"]["counts"]))),
    ]
    for what, want, got in counts:
        if got != want:
            raise VerificationError(name, f"{what} (against the per-context rows)", want, got, "rows disagree with the summary")
    for key in ("sum_kld", "sum_ear", "sum_jsd_bits", "sum_nll_ref", "sum_nll_cand"):
        from_rows = math.fsum(float(r[key]) for r in rows)
        scale = math.fsum(abs(float(r[key])) for r in rows)
        if not _close(float(t[key]), from_rows, scale):
            raise VerificationError(name, f"metrics.totals.{key}", f"{from_rows!r} (the sum of the per-context rows)", repr(float(t[key])),
                                    "rows disagree with the summary")
    if rows and n:
        row_max = max(float(r["max_kld"]) for r in rows)
        if float(t["max_kld"]) != row_max:
            raise VerificationError(name, "metrics.totals.max_kld", f"{row_max!r} (the largest per-context max)", repr(float(t["max_kld"])))
        for label, expect, value in (("metrics.kld.mean", float(t["sum_kld"]) / n, float(m["kld"]["mean"])),
                                     ("metrics.top1.agreement", int(t["top1_count"]) / n, float(m["top1"]["agreement"]))):
            if not _close(value, expect, abs(expect)):
                raise VerificationError(name, label, f"{expect!r} (from the totals)", repr(value), "rows disagree with the summary")
    for thr, c in t["exceedance"].items():
        if not 0 <= int(c) <= n:
            raise VerificationError(name, f"metrics.totals.exceedance[{thr}]", f"0..{n}", c)
    _check_diagnostic_totals(name, rows, t, n)


def _check_diagnostic_totals(name: str, rows: Sequence[ContextRow], t: Totals, n: int) -> None:
    """The diagnostics' totals against the per-context rows and the position count (when the report has them)."""
    d = t.get("diagnostics")
    if d is None:
        return
    for what, got in (("by_confidence", sum(int(c) for c in d["by_confidence"]["counts"])),
                      ("by_entropy", sum(int(c) for c in d["by_entropy"]["counts"]))):
        if got != n:
            raise VerificationError(name, f"metrics.totals.diagnostics.{what} total", n, got, "rows disagree with the summary")
    if not all(k in r for r in rows for k in DIAGNOSTIC_ROW_KEYS):
        raise VerificationError(name, "metrics.contexts", f"per-context {', '.join(DIAGNOSTIC_ROW_KEYS)}", "missing",
                                "the totals have diagnostics, the rows do not")
    for key in ("top5_shared", "top10_shared"):
        got_i = sum(int(_row_value(r, key)) for r in rows)
        if got_i != int(d[key]):
            raise VerificationError(name, f"metrics.totals.diagnostics.{key}", got_i, d[key], "rows disagree with the summary")
    from_rows = math.fsum(_row_value(r, "sum_kld_rev") for r in rows)
    scale = math.fsum(abs(_row_value(r, "sum_kld_rev")) for r in rows)
    if not _close(float(d["sum_kld_rev"]), from_rows, scale):
        raise VerificationError(name, "metrics.totals.diagnostics.sum_kld_rev", f"{from_rows!r} (the sum of the per-context rows)",
                                repr(float(d["sum_kld_rev"])), "rows disagree with the summary")


def check_against_suite(report: ShardReport, suite: SuiteShape) -> None:
    """The report belongs to ``suite`` (a :class:`~harness.reports.suite_shape.SuiteShape`): suite
    hash, shard index in range, shard hash, exactly the shard's contexts, whole rows per context."""
    name = _name(report)
    comp = report.comparability
    if comp["suite_token_sha256"] != suite.suite_token_sha256:
        raise VerificationError(name, "comparability.suite_token_sha256", suite.suite_token_sha256, comp["suite_token_sha256"],
                                f"the report is not of suite {suite.root}")
    k = _shard(report)
    if not 0 <= k < suite.n_shards:
        raise VerificationError(name, "comparability.shard.index", f"0..{suite.n_shards - 1} (the shards of {suite.root})", k)
    want_sha = suite.shards[k].sha256
    if comp["shard"]["sha256"] != want_sha:
        raise VerificationError(name, f"comparability.shard.sha256 of shard {k:02d}", want_sha, comp["shard"]["sha256"],
                                "the report's shard number and content disagree (swapped or edited)")
    want_idx = suite.shard_indices(k)
    got_idx = sorted(int(r["index"]) for r in report.metrics["contexts"])
    if got_idx != want_idx:
        extra = sorted(set(got_idx) - set(want_idx))
        lacking = sorted(set(want_idx) - set(got_idx))
        raise VerificationError(name, f"contexts of shard {k:02d}", f"{want_idx[0]}..{want_idx[-1]}",
                                f"extra {extra[:5]}, missing {lacking[:5]}" if extra or lacking else got_idx)
    per = suite.n_ctx - 1 - int(comp["score_from"])
    for r in report.metrics["contexts"]:
        if int(r["positions"]) != per:
            raise VerificationError(name, f"positions of context {r['index']}", f"{per} (n_ctx - 1 - score_from)", r["positions"])


def bracket(bounds: tuple[float, float], max_kld: float) -> list[float]:
    """A histogram bracket made finite: KLD >= 0 bounds the underflow bin, the exact max the overflow bin."""
    lo, hi = bounds
    return [max(lo, 0.0), min(hi, max_kld)]


def _cluster_bootstrap(
    rows: Sequence[ContextRow], n_boot: int, seed: int,
) -> tuple[dict[str, list[float] | None], dict[str, SideReading | None]]:
    """Studentized source-cluster bootstrap intervals (None: fewer clusters than the minimum) and how each was read."""
    clusters = sorted({str(r["cluster"]) for r in rows})
    pos = {c: i for i, c in enumerate(clusters)}
    idx = np.array([pos[str(r["cluster"])] for r in rows], dtype=np.int64)
    C = len(clusters)

    def per_cluster(key: str) -> np.ndarray:
        values: list[float] = [float(_row_value(r, key)) for r in rows]
        return np.bincount(idx, weights=np.array(values), minlength=C)

    W = draw_cluster_weights(C, n_boot, seed)
    counts = per_cluster("positions")
    sums = np.stack([per_cluster("sum_kld"), per_cluster("top1"), per_cluster("sum_ear")], axis=1)
    (kld, top1, ear), reads = ratio_intervals_read(W, sums, counts, bounds=(0.0, math.inf), right_skewed=(True, False, False))
    out = {"kld": kld, "top1": top1 and [top1[0], min(top1[1], 1.0)], "ear": ear and [ear[0], min(ear[1], 1.0)]}
    read = dict(zip(("kld", "top1", "ear"), reads))
    if rows and all(k in r for r in rows for k in DIAGNOSTIC_ROW_KEYS):
        # the diagnostics' intervals: the same draws, a separate call (the headline's values do not move)
        d = np.stack([per_cluster(k) for k in DIAGNOSTIC_ROW_KEYS], axis=1)
        (rev, t5, t10), dreads = ratio_intervals_read(W, d, counts, bounds=(0.0, math.inf), right_skewed=(True, False, False))
        out.update({"kld_rev": rev, "top5_overlap": t5 and [t5[0] / 5, min(t5[1] / 5, 1.0)],
                    "top10_overlap": t10 and [t10[0] / 10, min(t10[1] / 10, 1.0)]})
        read.update(zip(("kld_rev", "top5_shared", "top10_shared"), dreads))
    return out, read


#: Per-context row fields of the diagnostics (reports written before them lack the keys).
DIAGNOSTIC_ROW_KEYS = ("sum_kld_rev", "top5_shared", "top10_shared")


def _row_value(row: ContextRow, key: str) -> float:
    """A numeric field of a per-context row by name (the bootstrap's sums; a missing diagnostic is 0)."""
    value = dict(row).get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"per-context row field {key!r} is not a number")  # the schema check makes this unreachable
    return float(value)


def aggregate(reports: Sequence[ShardReport], *, n_shards: int | None = None, suite: SuiteLike | None = None) -> Aggregate:
    """Combine one candidate's shard reports; ``n_shards`` asks for a complete set. With ``suite``
    (a :class:`~harness.inputs.suite.Suite` or :class:`~harness.reports.suite_shape.SuiteShape`)
    every report is checked against it (:func:`check_against_suite`) and recorded in the result."""
    check_comparable(reports)
    shape = None if suite is None else SuiteShape.of(suite)
    if shape is not None:
        for r in reports:
            check_against_suite(r, shape)
    reports = sorted(reports, key=_shard)
    shards = [_shard(r) for r in reports]
    if n_shards is not None:
        missing = sorted(set(range(n_shards)) - set(shards))
        if missing:
            raise VerificationError(
                reports[0].candidate, "shards", f"all {n_shards} shards", f"missing {', '.join(f'{s:02d}' for s in missing)}"
            )
    t = merge_totals([r.metrics["totals"] for r in reports])
    n = int(t["n_positions"])
    rows = [row for r in reports for row in r.metrics["contexts"]]
    boot = reports[0].metrics["bootstrap"]
    ci, read = _cluster_bootstrap(rows, int(boot["n_boot"]), int(boot["seed"]))
    hist = LogHistogram.from_json(t["histogram"])
    strata: dict[str, StratumRow] = {}
    for row in rows:
        d = strata.setdefault(row["stratum"], {"contexts": 0, "positions": 0, "sum_kld": 0.0, "top1_count": 0,
                                               "mean_kld": 0.0, "top1": 0.0})
        d["contexts"] += 1
        d["positions"] += int(row["positions"])
        d["sum_kld"] += float(row["sum_kld"])
        d["top1_count"] += int(row["top1"])
    for d in strata.values():
        d["mean_kld"] = d["sum_kld"] / d["positions"]
        d["top1"] = d["top1_count"] / d["positions"]
    comp = set_comparability(reports[0].comparability)
    agg: Aggregate = {
        "schema": SCHEMA,
        "candidate": reports[0].candidate,
        "comparability": comp,
        "shards": [{"index": _shard(r), "sha256": r.comparability["shard"]["sha256"]} for r in reports],
        "complete": n_shards is not None,
        "n_positions": n,
        "n_contexts": len(rows),
        "n_clusters": len({str(r["cluster"]) for r in rows}),
        "score_from": int(comp["score_from"]),
        "kld": {
            "mean": t["sum_kld"] / n,
            "ci95": ci["kld"],
            "max": t["max_kld"],
            "quantile_bounds": {f"p{q * 100:g}": bracket(hist.quantile_bounds(q), float(t["max_kld"])) for q in QUANTILES},
        },
        "top1": {"agreement": t["top1_count"] / n, "count": int(t["top1_count"]), "ci95": ci["top1"]},
        "ear": {"mean": t["sum_ear"] / n, "ci95": ci["ear"]},
        "jsd_bits": {"mean": t["sum_jsd_bits"] / n},
        "ppl": {
            "ref": math.exp(t["sum_nll_ref"] / n),
            "cand": math.exp(t["sum_nll_cand"] / n),
            "mean_ln_ratio": (t["sum_nll_cand"] - t["sum_nll_ref"]) / n,
        },
        "delta_p": {"mean": t["sum_delta_p"] / n, "rms": math.sqrt(t["sum_delta_p_sq"] / n)},
        "exceedance": t["exceedance"],
        "histogram": t["histogram"],
        "per_stratum": dict(sorted(strata.items())),
        "bootstrap": {"method": MEAN_METHOD, "method_text": method_text([read["kld"]], "the KLD") + ", over per-context rows",
                      "levels": {k: r.to_json() for k, r in read.items() if r is not None},
                      "level_guaranteed": not (read["kld"] is not None and read["kld"].dominated),
                      "min_clusters": MIN_CLUSTERS, "n_boot": int(boot["n_boot"]), "seed": int(boot["seed"])},
    }
    diagnostics = _diagnostics(t, n, ci)
    if diagnostics is not None:
        agg["diagnostics"] = diagnostics
    if shape is not None:
        agg["suite"] = shape.to_json()
    return agg


def _diagnostics(t: Totals, n: int, ci: dict[str, list[float] | None]) -> Diagnostics | None:
    """The diagnostics from merged totals, with the intervals of the per-context rows; None when a report of
    the set predates the diagnostics (no partial block)."""
    if "diagnostics" not in t or "kld_rev" not in ci:
        return None
    d = diagnostics_from_totals(t["diagnostics"], n, int(t["top1_count"]))
    d["kld_rev"]["ci95"] = ci["kld_rev"]
    d["top5_overlap"]["ci95"] = ci["top5_overlap"]
    d["top10_overlap"]["ci95"] = ci["top10_overlap"]
    return d


# ------------------------------------------------------------------ ladder (one row per candidate)
def ladder_rows(reports: Sequence[ShardReport], verdicts: dict[tuple[str, int], bool] | None = None, *,
                suite: SuiteLike | None = None, no_baseline: set[tuple[str, int]] | None = None) -> list[LadderRow]:
    """One aggregated row per candidate, sorted by mean KLD (best first); ``suite`` as in :func:`aggregate`.
    ``no_baseline``: the failed ``(candidate, shard)`` cases that failed only for want of a baseline file: their
    verdict says "no baseline" (never a bare "FAIL").
    ``resolvable_delta``: the difference in mean KLD this suite resolves (:mod:`harness.planning.design`)."""
    from harness.planning.design import single_run_resolvable_delta

    by_cand: dict[str, list[ShardReport]] = {}
    for r in reports:
        by_cand.setdefault(r.candidate, []).append(r)
    rows: list[LadderRow] = []
    for name, group in by_cand.items():
        agg = aggregate(group, suite=suite)
        shards = [s["index"] for s in agg["shards"]]
        passed = [(verdicts or {}).get((name, s)) for s in shards]
        verdict = "—" if any(p is None for p in passed) else ("pass" if all(passed) else f"FAIL ({passed.count(False)}/{len(passed)})")
        lacking = sum(1 for s in shards if (name, s) in (no_baseline or set()))
        if lacking and verdict != "pass":
            gated = passed.count(False) - lacking
            verdict = "no baseline" + (f"; FAIL ({gated}/{len(passed)})" if gated else "")
        cand = agg["comparability"]["candidate"]
        size = cand.get("size_bytes")
        row: LadderRow = {
                "candidate": name,
                "size_bytes": size if isinstance(size, int) and not isinstance(size, bool) else None,
                "bits_per_weight": cand.get("bits_per_weight"),
                "shards": shards,
                "n_positions": agg["n_positions"],
                "mean_kld": agg["kld"]["mean"],
                "ci95": agg["kld"]["ci95"],
                "p99_bounds": agg["kld"]["quantile_bounds"]["p99"],
                "max_kld": agg["kld"]["max"],
                "top1": agg["top1"]["agreement"],
                "verdict": verdict,
                "resolvable_delta": single_run_resolvable_delta([c for r in group for c in r.metrics["contexts"]]),
                "aggregate": agg,
        }
        _ladder_diagnostics(row, agg)
        rows.append(row)
    return sorted(rows, key=lambda r: (r["mean_kld"], r["candidate"]))


def _ladder_diagnostics(row: LadderRow, agg: Aggregate) -> None:
    """The diagnostics a ladder row carries beside the headline (absent for reports that predate them):
    mean reverse KL, top-5/top-10 overlap, llama-perplexity's "same top", the candidate's mean probability
    of the reference's top token; the tables stay in ``aggregate.diagnostics``."""
    d = agg.get("diagnostics")
    if d is None:
        return
    row.update({"kld_rev_mean": d["kld_rev"]["mean"], "kld_rev_ci95": d["kld_rev"]["ci95"],
                "top5_overlap": d["top5_overlap"]["mean"], "top10_overlap": d["top10_overlap"]["mean"],
                "same_top": d["same_top"]["fraction"], "q_ref_top_mean": d["q_ref_top_mean"]})


def _fmt(x: float) -> str:
    return f"{x:.3e}" if (x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e4)) else f"{x:.4f}"


def _size(b: int | None) -> str:
    return size_text(b)


#: What every ladder's mean KLD includes, stated once under each ladder (terminal, ladder.md, step summary, card).
INCLUDES = ("Each mean KLD: KL(P_reference || P_candidate) per scored position, both sides bf16 executions of their "
            "weights through one shared head (fp32 logits); it includes both forwards' bf16 rounding, is never net of "
            "the precision floor, and does not measure either model against exact arithmetic.")
#: The mark of a candidate whose interval overlaps the precision floor's.
INDISTINGUISHABLE = "indistinguishable from bf16 execution"


def matching_floor(path: Path, comparability: SetComparability | None) -> FloorRecord | None:
    """The precision floor at ``path`` (``fidelity.precision-floor/1``) when it measures the ladder ``rows``' suite
    and reference, else None (a floor of another suite or reference is never shown). ``comparability``: the
    ladder's (any of its reports'), None for an empty ladder."""
    if not path.is_file() or comparability is None:
        return None
    doc = read_json(path)
    if doc.get("schema") != "fidelity.precision-floor/1":
        return None
    # a report folder travels: a floor that lies is a named refusal, never a KeyError at the end of a run
    floor = checked(doc, FloorRecord, path)
    if floor["suite"]["suite_token_sha256"] != comparability["suite_token_sha256"]:
        return None
    if floor["reference"]["identity"] != comparability["reference"].get("identity"):
        return None
    return floor


def annotate_floor(rows: Sequence[LadderLine], floor: FloorRecord | None) -> None:
    """Give each ladder row ``floor_ratio`` (its mean KLD / the floor's mean) and ``vs_floor``
    (:data:`INDISTINGUISHABLE` when its 95% interval overlaps the floor's, else ``"above the floor"``);
    ``floor``: a ``fidelity.precision-floor/1`` result of the same suite and reference, or None (rows untouched)."""
    if floor is None:
        return
    k = floor["kld"]
    f_lo, f_hi = k["ci95"] or (k["mean"], k["mean"])
    for r in rows:
        lo, hi = r["ci95"] or (r["mean_kld"], r["mean_kld"])
        r["floor_ratio"] = r["mean_kld"] / k["mean"] if k["mean"] > 0 else None
        r["vs_floor"] = INDISTINGUISHABLE if lo <= f_hi and f_lo <= hi else "above the floor"


def floor_line(floor: FloorRecord) -> str:
    """One line: the precision floor with its interval, what it compares, over which positions."""
    k = floor["kld"]
    ci = f"[{_fmt(k['ci95'][0])}, {_fmt(k['ci95'][1])}]" if k["ci95"] else "[not estimable]"
    sample = floor.get("sample")
    where = sample["text"] if sample else "every context of the run's shards"
    return (f"Precision floor of the reference: {_fmt(k['mean'])} {ci} nats, KL(bf16 reference capture || "
            f"{floor['compute']['dtype']} forward of the same weights) over {floor['n_positions']} positions ({where}, "
            f"score_from={floor.get('score_from', 0)}). A mean KLD near it cannot be told from the reference's own "
            "rounding; it is not subtracted (rounding noise changes with the weights).")


def ladder_notes(floor: FloorRecord | None) -> list[str]:
    """The lines under every ladder table: what its numbers include, and the precision floor (when measured)."""
    return [INCLUDES, *([floor_line(floor)] if floor is not None else [])]


def format_ladder(rows: Sequence[LadderLine]) -> list[str]:
    """The ladder as aligned text lines (terminal) — also valid Markdown table rows. Rows annotated by
    :func:`annotate_floor` get a ``× floor`` column (the ratio, and the mark when indistinguishable)."""
    floored = any("floor_ratio" in r for r in rows)
    head = ["candidate", "bpw (linear / all)", "size", "shards", "mean KLD [95% CI]", *(["× floor"] if floored else []),
            "p99 (bin)", "top-1", "baseline"]
    body = []
    for r in rows:
        ci = f"[{_fmt(r['ci95'][0])}, {_fmt(r['ci95'][1])}]" if r["ci95"] else "[not estimable]"
        ratio = [] if not floored else [
            ("—" if r.get("floor_ratio") is None else f"{r['floor_ratio']:.3g}×")
            + (f" ({INDISTINGUISHABLE})" if r.get("vs_floor") == INDISTINGUISHABLE else "")]
        body.append(
            [
                r["candidate"],
                bpw_text(r.get("bits_per_weight")),
                _size(r["size_bytes"]),
                str(len(r["shards"])),
                f"{_fmt(r['mean_kld'])} {ci}",
                *ratio,
                f"≤ {_fmt(r['p99_bounds'][1])}",
                f"{r['top1']:.4f}",
                r["verdict"],
            ]
        )
    return md_table(head, body, aligned=True)


def not_measured_lines(not_measured: Sequence[NotMeasured]) -> list[str]:
    """Markdown lines naming each configured candidate without a report, its status and the reason (none
    when every candidate was measured)."""
    if not not_measured:
        return []
    return ["Configured but not measured (no shard report):", "",
            *(f"- `{m['candidate']}`: {m['status']}: {m['reason']}" for m in not_measured)]


def ladder_files(out_dir: Path, rows: Sequence[LadderLine], floor: FloorRecord | None = None,
                 not_measured: Sequence[NotMeasured] = ()) -> dict[Path, str]:
    """``ladder.md`` and ``ladder.json`` (the aggregates) as ``{path: text}``; ``floor``, a precision-floor
    result of the same suite (``fidelity.precision-floor/1``), is shown beside the table and stored as
    ``precision_floor`` (``mean``, ``ci95``, ``dtype``, ``shards``, ``n_positions``, ``definition``).
    ``not_measured``: configured candidates without a report (``candidate``, ``status`` — ``failed``,
    ``skipped`` or ``not run`` — and ``reason``), listed under the table and in ``not_measured``."""
    out_dir = Path(out_dir)
    doc: dict[str, object] = {"schema": "fidelity.ladder/1", "rows": [dict(r) for r in rows],
                           "not_measured": [dict(m) for m in not_measured]}
    md = "# Fidelity ladder\n\n" + "\n".join(format_ladder(rows)) + "\n"
    if not_measured:
        md += "\n" + "".join(line + "\n" for line in not_measured_lines(not_measured))
    doc["includes"] = INCLUDES
    md += "".join(f"\n{line}\n" for line in ladder_notes(floor))
    if floor is not None:
        k = floor["kld"]
        doc["precision_floor"] = {"mean": k["mean"], "ci95": k["ci95"], "dtype": floor["compute"]["dtype"],
                                  "shards": floor["suite"]["shards"], "n_positions": floor["n_positions"],
                                  "score_from": floor.get("score_from", 0), "sample": floor.get("sample"),
                                  "definition": floor["definition"]}
    return {out_dir / "ladder.md": md, out_dir / "ladder.json": dumps_json(doc)}


def write_ladder(out_dir: Path, rows: Sequence[LadderLine], floor: FloorRecord | None = None,
                 not_measured: Sequence[NotMeasured] = ()) -> None:
    """Write ``ladder.md`` and ``ladder.json`` as one unit (both or neither)."""
    atomic_write_files(ladder_files(out_dir, rows, floor, not_measured))
