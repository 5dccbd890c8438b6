"""Tail reports (``pytest fidelity.toml -m fidelity_tails``): per shard and cumulative tail statistics of one candidate.

Per shard (exact, from the shard's own positions): numpy "linear" percentiles p50, p90, p99,
p99.9, CVaR1% (mean of the worst 1 %, fractional boundary weight), the exact max and exact
exceedance counts (``KLD > t`` for t in 1e-4 ... 1 nats).

Reasoning: docs/statistics.md §"Tail reports".
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np

from harness.errors import VerificationError
from harness.gate.baselines import load_baseline_or_none
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.md_table import md_table
from harness.io.schema import Closed, MapOf, Nullable, OneOf, Optional
from harness.metrics.histogram import EDGES, LogHistogram, exceedance_counts
from harness.metrics.positions import ScoredPositions, layout
from harness.metrics.records import ShardSummary
from harness.metrics.tails import cvar, quantile
from harness.reports.numbers import fmt_g
from harness.reports.plot import Ccdf, render_ccdf

SCHEMA = "fidelity.tails/1"
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999))


class TailStats(TypedDict):
    """Exact tail statistics of a set of positions: percentiles by name (``p50`` ... ``p99.9``), CVaR1%, max,
    and exceedance counts ``KLD > t`` by threshold."""

    n_positions: int
    percentiles: dict[str, float]
    cvar1: float
    max: float
    exceedance: dict[str, int]


class ShardTails(TailStats):
    """One shard's exact tail statistics."""

    shard: int


class CumulativeTails(TailStats):
    """The pooled statistics of every shard, with the brackets the summed histograms give: ``[lo, hi]`` per
    percentile, and ``[at least, at most]`` per exceedance count."""

    quantile_bounds: dict[str, list[float]]
    exceedance_histogram_bounds: dict[str, list[int]]


class TailReport(TypedDict):
    """One candidate's tail report (``fidelity.tails/1``; the payload of the ``tails`` report kind)."""

    schema: str
    candidate: str
    score_from: int
    shards: list[ShardTails]
    cumulative: CumulativeTails
    ccdf: Ccdf
    #: the largest ``max_p99`` of the candidate's baseline over the shards (None: none), set by the case
    max_p99_baseline: NotRequired[float | None]
    #: what :func:`check_tails` finds, set by the case
    problems: NotRequired[list[str]]


def _stats(kld: np.ndarray) -> TailStats:
    return {
        "n_positions": int(kld.shape[0]),
        "percentiles": {name: quantile(kld, q) for name, q in PERCENTILES},
        "cvar1": cvar(kld, 0.01),
        "max": float(kld.max()),
        "exceedance": exceedance_counts(kld),
    }


def ccdf_points(hist: LogHistogram) -> Ccdf:
    """``x`` = histogram edges, ``y`` = fraction of positions with KLD >= x (zero tails dropped)."""
    n = hist.total
    at_least = np.cumsum(hist.counts[::-1])[::-1]  # at_least[i] = count in bins >= i
    ys = at_least[1 : len(EDGES) + 1] / max(n, 1)  # edge k starts count index k + 1
    keep = ys > 0
    return {"x": [float(x) for x in EDGES[keep]], "y": [float(y) for y in ys[keep]]}


def exceedance_brackets(hist: LogHistogram, thresholds: Iterable[str]) -> dict[str, list[int]]:
    """For each exceedance threshold ``t`` (a histogram edge), the bracket the summed *histogram*
    puts on the exact count of ``KLD > t``: at least the positions in bins above the next edge, at
    most those in bins from ``t`` up. The exact counts come from the raw values, so comparing the
    two checks one computation against an independent one."""
    counts = np.asarray(hist.counts, dtype=np.int64)
    out = {}
    for key in thresholds:
        k = int(np.argmin(np.abs(np.log10(EDGES) - np.log10(float(key)))))  # the edge equal to t
        # count index i holds [EDGES[i-1], EDGES[i]): edge k starts count index k + 1
        out[key] = [int(counts[k + 2 :].sum()), int(counts[k + 1 :].sum())]
    return out


def tail_report(candidate: str, shards: Sequence[tuple[int, ScoredPositions]], score_from: int) -> TailReport:
    """Tail statistics of ``candidate`` from ``(shard number, ShardPositions)`` pairs."""
    per_shard: list[ShardTails] = []
    values = []
    hist = LogHistogram()
    for shard, pos in sorted(shards, key=lambda t: t[0]):
        kld = layout(pos.scores, pos.context_index, pos.row, pos.labels, score_from).scores.kld
        values.append(kld)
        h = LogHistogram.from_values(kld)
        hist = hist + h
        per_shard.append({"shard": int(shard), **_stats(kld)})
    allv = np.concatenate(values)
    pooled = _stats(allv)
    # brackets made finite: KLD >= 0 bounds the underflow bin, the exact max the overflow bin
    cum: CumulativeTails = {**pooled, "quantile_bounds": {name: [max(lo, 0.0), min(hi, pooled["max"])]
                                                          for name, q in PERCENTILES for lo, hi in [hist.quantile_bounds(q)]},
                            "exceedance_histogram_bounds": exceedance_brackets(hist, pooled["exceedance"])}
    return {
        "schema": SCHEMA,
        "candidate": candidate,
        "score_from": int(score_from),
        "shards": per_shard,
        "cumulative": cum,
        "ccdf": ccdf_points(hist),
    }


def check_tails(rep: TailReport, max_p99: float | None = None) -> list[str]:
    """Violated invariants of a tail report (empty list: consistent and within the limit)."""
    out = []
    cum = rep["cumulative"]
    name = rep["candidate"]
    for t, (lo_c, hi_c) in cum["exceedance_histogram_bounds"].items():
        exact = cum["exceedance"][t]
        if not lo_c <= exact <= hi_c:
            out.append(f"{name}: exact count of KLD > {t} is {exact}, outside the summed histogram's bracket [{lo_c}, {hi_c}]")
    xs = rep["ccdf"]["x"]
    if xs:  # the exact max lies in the highest non-empty histogram bin
        top = xs[-1]
        if not top <= cum["max"]:
            out.append(f"{name}: exact max {cum['max']:.6g} below the highest non-empty histogram bin (from {top:.6g})")
    elif cum["max"] >= float(EDGES[0]):
        out.append(f"{name}: exact max {cum['max']:.6g} but the summed histogram holds nothing >= {float(EDGES[0]):.6g}")
    for pname, pct in cum["percentiles"].items():
        lo, hi = cum["quantile_bounds"][pname]
        if not lo <= pct <= hi:
            out.append(f"{name}: exact cumulative {pname} {pct:.6g} outside its histogram bracket [{lo:.6g}, {hi:.6g}]")
    if max_p99 is not None and cum["quantile_bounds"]["p99"][0] > max_p99:
        lo = cum["quantile_bounds"]["p99"][0]
        out.append(f"{name}: p99 >= {lo:.6g} (bin-bounded, all shards) > max {max_p99:.6g} (max_p99 of its baseline)")
    return out


_STATS: dict[str, object] = {"n_positions": int, "percentiles": Closed({name: float for name, _q in PERCENTILES}),
                          "cvar1": float, "max": float, "exceedance": MapOf(int)}
#: One candidate's tail report as ``tails.json`` holds it and ``publish`` reads it back (harness.io.schema).
REPORT_SCHEMA = Closed({
    "schema": OneOf(SCHEMA), "candidate": str, "score_from": int,
    "shards": [Closed({"shard": int, **_STATS})],
    "cumulative": Closed({**_STATS, "quantile_bounds": Closed({name: [float] for name, _q in PERCENTILES}),
                          "exceedance_histogram_bounds": MapOf([int])}),
    "ccdf": Closed({"x": [float], "y": [float]}),
    "max_p99_baseline": Optional(Nullable(float)), "problems": Optional([str]),
})
#: ``tails.json``.
FILE_SCHEMA = Closed({"schema": OneOf(SCHEMA), "candidates": [REPORT_SCHEMA]})


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)


def verify_tail_report(rep: TailReport, path: str | Path, where: str, metrics: Mapping[int, ShardSummary]) -> None:
    """Refuse a tail report (``rep``, at ``where`` in ``path``, already matching :data:`REPORT_SCHEMA`) that does
    not follow from its candidate's shard reports (``metrics``: shard index -> the report's ``metrics``).

    Per shard, the exact statistics a shard report also holds (positions, p50, p99, p99.9, CVaR1%, max,
    exceedance counts) must be equal, and p90 must lie in the shard histogram's bracket. Cumulative: positions,
    max and exceedance counts add up; the brackets and the CCDF are re-derived from the summed histograms; the
    exact pooled percentiles lie in their brackets and CVaR1% between the p99 bracket's low end and the max;
    ``problems`` is what :func:`check_tails` finds."""
    hist = LogHistogram()
    for j, s in enumerate(rep["shards"]):
        at = f"{where}.shards[{j}]"
        m = metrics.get(s["shard"])
        if m is None:
            raise VerificationError(path, f"{at}.shard", f"a shard {rep['candidate']} has a report for ({sorted(metrics)})", s["shard"])
        if m["score_from"] != rep["score_from"]:
            raise VerificationError(path, f"{where}.score_from", f"{m.get('score_from')} (its shard reports')", rep["score_from"])
        if "histogram" not in m or "exceedance" not in m:
            raise VerificationError(path, at, "a shard report with a histogram and exceedance counts to check it against",
                                    "a report without them")
        k = m["kld"]
        want: dict[str, float | None] = {"n_positions": m["n_positions"], "percentiles.p50": k["median"], "percentiles.p99": k["p99"],
                "percentiles.p99.9": k["p999"], "cvar1": k["cvar1"], "max": k["max"]}
        got = {"n_positions": s["n_positions"], **{f"percentiles.{n}": s["percentiles"][n] for n in ("p50", "p99", "p99.9")},
               "cvar1": s["cvar1"], "max": s["max"]}
        for key, w in want.items():
            if w is None or not _close(float(got[key]), float(w)):
                raise VerificationError(path, f"{at}.{key}", f"{w!r} (shard {s['shard']}'s report)", got[key])
        if s["exceedance"] != m["exceedance"]:
            raise VerificationError(path, f"{at}.exceedance", f"{m['exceedance']} (shard {s['shard']}'s report)", s["exceedance"])
        h = LogHistogram(np.asarray(m["histogram"]["counts"], dtype=np.int64))
        lo, hi = h.quantile_bounds(0.9)
        if not max(lo, 0.0) <= s["percentiles"]["p90"] <= min(hi, s["max"]):
            raise VerificationError(path, f"{at}.percentiles.p90", f"within [{lo:.6g}, {hi:.6g}] (shard {s['shard']}'s histogram)",
                                    s["percentiles"]["p90"])
        hist = hist + h
    cum, at = rep["cumulative"], f"{where}.cumulative"
    shards = rep["shards"]
    n_derived, max_derived = hist.total, max((s["max"] for s in shards), default=None)
    exceedance_derived = {t: sum(s["exceedance"].get(t, 0) for s in shards) for t in cum["exceedance"]}
    if not shards or max_derived is None or cum["n_positions"] != n_derived or not _close(cum["max"], max_derived):
        raise VerificationError(path, at, f"{n_derived} positions, max {max_derived!r} (the shards')",
                                f"{cum['n_positions']} positions, max {cum['max']!r}")
    if cum["exceedance"] != exceedance_derived or set(cum["exceedance"]) != set(shards[0]["exceedance"]):
        raise VerificationError(path, f"{at}.exceedance", f"{exceedance_derived} (the shards' sums)", cum["exceedance"])
    bounds = {name: [max(lo, 0.0), min(hi, cum["max"])] for name, q in PERCENTILES for lo, hi in [hist.quantile_bounds(q)]}
    checks: tuple[tuple[str, object, object], ...] = (
        ("quantile_bounds", bounds, cum["quantile_bounds"]),
        ("exceedance_histogram_bounds", exceedance_brackets(hist, cum["exceedance"]), cum["exceedance_histogram_bounds"]),
        ("ccdf", ccdf_points(hist), rep["ccdf"]))
    for key, want_v, got_v in checks:
        if json.dumps(want_v, sort_keys=True) != json.dumps(got_v, sort_keys=True):
            raise VerificationError(path, f"{where}.{key}" if key == "ccdf" else f"{at}.{key}",
                                    "what the shard reports' summed histograms give", "other values")
    for name, exact in cum["percentiles"].items():
        lo, hi = bounds[name]
        if not lo <= exact <= hi:
            raise VerificationError(path, f"{at}.percentiles.{name}", f"within [{lo:.6g}, {hi:.6g}] (the summed histograms)", exact)
    if not bounds["p99"][0] <= cum["cvar1"] <= cum["max"]:
        raise VerificationError(path, f"{at}.cvar1", f"within [{bounds['p99'][0]:.6g}, {cum['max']:.6g}] (p99 bracket .. max)", cum["cvar1"])
    if "problems" in rep and rep["problems"] != check_tails(rep, rep.get("max_p99_baseline")):
        raise VerificationError(path, f"{where}.problems", check_tails(rep, rep.get("max_p99_baseline")), rep["problems"])


def baseline_max_p99(baselines_dir: str | Path, candidate: str, shards: Sequence[int]) -> float | None:
    """The largest ``max_p99`` that applies to any of ``shards`` in the candidate's baseline (None: none)."""
    b = load_baseline_or_none(Path(baselines_dir), candidate)
    if b is None:
        return None
    limits = [b.thresholds(s).get("max_p99") for s in shards]
    vals = [v for v in limits if v is not None]
    return max(vals) if vals else None


def render_tails(reports: Sequence[TailReport]) -> str:
    """``tails.md``: one section per candidate, per shard rows and the cumulative row."""
    lines = ["# Tail report", "", "KLD in nats. Per-shard percentiles are exact; cumulative ones are exact "
             "(pooled positions) with the histogram bracket a report-only consumer would get. "
             "Exceedance counts are exact (KLD > t).", ""]
    for rep in sorted(reports, key=lambda r: r["candidate"]):
        cum = rep["cumulative"]
        thr = list(cum["exceedance"])
        lines += [f"## {rep['candidate']} (score_from={rep['score_from']})", ""]
        head = ["shard", "positions"] + [n for n, _ in PERCENTILES] + ["CVaR1%", "max"] + [f">{t}" for t in thr]
        rows = []
        for s in rep["shards"]:
            cells = [f"{s['shard']:02d}", str(s["n_positions"])] + [fmt_g(s["percentiles"][n]) for n, _ in PERCENTILES]
            cells += [fmt_g(s["cvar1"]), fmt_g(s["max"])] + [str(s["exceedance"][t]) for t in thr]
            rows.append(cells)
        cells = ["**all**", str(cum["n_positions"])]
        for n, _ in PERCENTILES:
            lo, hi = cum["quantile_bounds"][n]
            cells.append(f"{fmt_g(cum['percentiles'][n])} [{fmt_g(lo)}, {fmt_g(hi)}]")
        cells += [fmt_g(cum["cvar1"]), fmt_g(cum["max"])] + [str(cum["exceedance"][t]) for t in thr]
        lines += md_table(head, [*rows, cells]) + [""]
        if rep.get("problems"):
            lines += ["Problems:", ""] + [f"- {p}" for p in rep["problems"]] + [""]
    lines += ["Plot: `tails.png` (KLD complementary CDF, log-log, all candidates).", ""]
    return "\n".join(lines)


def write_tails(out_dir: str | Path, reports: Sequence[TailReport], palette_names: Sequence[str] | None = None) -> list[Path]:
    """Write ``tails.json``, ``tails.md`` and ``tails.png`` (colours: :func:`harness.reports.plot.candidate_colors`
    with ``palette_names``) into ``out_dir``; returns the paths."""
    from pathlib import Path

    out = Path(out_dir)
    reps = sorted(reports, key=lambda r: r["candidate"])
    png = render_ccdf({r["candidate"]: r["ccdf"] for r in reps}, palette_names)
    return atomic_write_files({out / "tails.json": dumps_json({"schema": SCHEMA, "candidates": reps}),
                               out / "tails.md": render_tails(reps), out / "tails.png": png})  # all three or none


__all__ = ["tail_report", "check_tails", "render_tails", "write_tails", "ccdf_points", "baseline_max_p99"]
