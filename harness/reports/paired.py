"""Paired comparisons of two candidates (``pytest fidelity.toml -m fidelity_paired``, ``fidelity paired``).

Reasoning: docs/statistics.md §"Paired comparisons".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np

from harness.errors import FidelityError, VerificationError
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.md_table import md_table
from harness.metrics import paired
from harness.metrics.bootstrap import DEFAULT_SEED, draw_cluster_weights, ratio_intervals
from harness.metrics.paired import ContextWins, PairedStats
from harness.metrics.positions import ScoredPositions
from harness.metrics.records import ContextRow
from harness.metrics.scores import PositionScores
from harness.reports.numbers import fmt_g

SCHEMA = "fidelity.paired/1"
VERDICTS = ("equivalent", "A better", "B better", "inconclusive", "not estimable")
#: Level of each one-sided test of the equivalence (TOST) verdict: each end of the 95 % interval, read at its level
#: (measured 0.7-2.1 % at the margin: docs/statistics.md "What reads the interval, measured").
ALPHA_SIDE = 0.025
TEST = (f"equivalent: TOST at alpha {ALPHA_SIDE} per side, each end of the 95% studentized interval of the "
        "mean-KLD difference (it lies within ±margin); better: the interval excludes 0 (two-sided, 5%)")


class MarginRule(TypedDict):
    """How a pair's margin in nats was formed: its kind (:data:`MARGIN_KINDS`), the value as written, in words,
    and the precision floor's mean it multiplies (``floor`` margins; else None)."""

    kind: str
    value: float
    text: str
    floor_mean: float | None


class PairedReport(PairedStats):
    """A paired comparison (``fidelity.paired/1``; module docstring): the differences of
    :func:`harness.metrics.paired`, the margin, the verdict and the shards it covers."""

    schema: str
    a: str
    b: str
    #: the margin in nats
    margin: float
    verdict: str
    #: the verdict with the candidates' names
    verdict_named: str
    test: str
    alpha_per_side: float
    #: the smallest margin these data would call equivalent (None: not estimable)
    certifiable_margin: float | None
    #: both candidates' mean KLD as compensated sums of the raw windowed values
    independent_kld_means: dict[str, float]
    #: reports written before margins had kinds lack the key
    margin_rule: NotRequired[MarginRule]
    #: set (None when the margin is sound) in every report that has a margin rule
    margin_warning: NotRequired[str | None]
    #: the shard numbers of the positions, in order (absent: every shard both candidates have)
    shards: NotRequired[list[int]]


def verdict(ci: Sequence[float] | None, margin: float) -> str:
    """The verdict from the 95% interval of the mean-KLD difference a - b and the margin (see module docs)."""
    if ci is None:
        return "not estimable"
    lo, hi = float(ci[0]), float(ci[1])
    if -margin <= lo and hi <= margin:
        return "equivalent"
    if hi < 0:
        return "A better"
    if lo > 0:
        return "B better"
    return "inconclusive"


#: How a pair's margin is written (``[[pairs]] margin``): nats, a fraction of the better candidate's mean KLD,
#: or a multiple of the reference's precision floor.
MARGIN_KINDS = ("absolute", "relative", "floor")


def resolve_margin(value: float, kind: str, mean_a: float, mean_b: float,
                   floor_mean: float | None = None) -> tuple[float, MarginRule]:
    """The margin in nats and its rule (``kind``, ``value``, ``text``, ``floor_mean``) from the margin as written
    (:data:`MARGIN_KINDS`); a ``floor`` margin needs ``floor_mean``."""
    if kind == "absolute":
        nats, text = value, f"{value:g} nats"
    elif kind == "relative":
        better = min(mean_a, mean_b)
        nats, text = value * better, f"{100 * value:g}% of the better candidate's mean KLD {better:.4g}"
    elif kind == "floor":
        if floor_mean is None:
            raise FidelityError(f"margin '{value:g}x floor' needs the reference's precision floor, which is not measured")
        nats, text = value * floor_mean, f"{value:g} x the precision floor {floor_mean:.4g}"
    else:
        raise FidelityError(f"margin kind: expected one of {', '.join(MARGIN_KINDS)}, found {kind!r}")
    return nats, {"kind": kind, "value": value, "text": text, "floor_mean": floor_mean}


def margin_warning(margin: float, mean_a: float, mean_b: float) -> str | None:
    """The flag of a margin larger than both candidates' mean KLDs (None otherwise): at such a margin
    'equivalent' says next to nothing."""
    if margin <= max(mean_a, mean_b):
        return None
    return (f"margin {margin:.3g} exceeds both mean KLDs ({mean_a:.3g}, {mean_b:.3g}): 'equivalent' at this margin says "
            "little; use a relative margin (\"20%\") or one tied to the floor (\"2x floor\")")


def pair_id(a: str, b: str) -> str:
    return f"{a}-vs-{b}"


def paired_report(
    a: str, b: str, pos_a: Sequence[ScoredPositions], pos_b: Sequence[ScoredPositions], *, margin: float, score_from: int = 0,
    n_boot: int = 10_000, shards: Sequence[int] | None = None, margin_kind: str = "absolute",
    floor_mean: float | None = None,
) -> PairedReport:
    """Paired comparison of ``a`` and ``b`` from their :class:`~harness.run.shard.ShardPositions` (same shards, same order).
    ``shards``: the shard numbers of the positions, in order (recorded, so a reader can re-derive the report
    from the shard reports: :func:`verify_paired`). ``margin`` as written, of ``margin_kind``
    (:func:`resolve_margin`); the report's ``margin`` is in nats, ``margin_rule`` says how it was formed and
    ``margin_warning`` flags one larger than both mean KLDs."""
    for pa, pb in zip(pos_a, pos_b):
        if not (np.array_equal(pa.context_index, pb.context_index) and np.array_equal(pa.row, pb.row)):
            raise FidelityError(f"paired {a} vs {b}: the two candidates were not scored on the same positions")
    if len(pos_a) != len(pos_b):
        raise FidelityError(f"paired {a} vs {b}: {len(pos_a)} and {len(pos_b)} shards")
    sa = PositionScores.concat([p.scores for p in pos_a])
    sb = PositionScores.concat([p.scores for p in pos_b])
    rows = np.concatenate([p.row for p in pos_a]) >= score_from
    fsum = {k: math.fsum(np.asarray(s.kld, dtype=np.float64)[rows].tolist()) / int(rows.sum()) for k, s in (("a", sa), ("b", sb))}
    ctx = np.concatenate([p.context_index for p in pos_a])
    row = np.concatenate([p.row for p in pos_a])
    labels = [lab for p in pos_a for lab in p.labels]
    res = paired(sa, sb, ctx, row, labels, score_from=score_from, n_boot=n_boot)
    ci = res["kld_mean"]["ci95"]
    margin, rule = resolve_margin(float(margin), margin_kind, fsum["a"], fsum["b"], floor_mean)
    v = verdict(ci, margin)
    named = {"A better": f"{a} better", "B better": f"{b} better"}.get(v, v)
    certifiable = None if ci is None else max(-float(ci[0]), float(ci[1]))
    rep: PairedReport = {"n_positions": res["n_positions"], "n_contexts": res["n_contexts"], "n_clusters": res["n_clusters"],
                         "score_from": res["score_from"], "bootstrap": res["bootstrap"], "difference": res["difference"],
                         "kld_mean": res["kld_mean"], "top1": res["top1"], "ear_mean": res["ear_mean"],
                         "kld_p99": res["kld_p99"], "kld_cvar1": res["kld_cvar1"], "contexts": res["contexts"],
                         "schema": SCHEMA, "a": a, "b": b, "margin": float(margin), "margin_rule": rule,
                         "margin_warning": margin_warning(margin, fsum["a"], fsum["b"]), "verdict": v,
                         "verdict_named": named, "test": TEST, "alpha_per_side": ALPHA_SIDE,
                         "certifiable_margin": certifiable, "independent_kld_means": fsum}
    if shards is not None:
        rep["shards"] = [int(x) for x in shards]
    return rep


def check_paired(rep: PairedReport, expect: str | None = None) -> list[str]:
    """Checks of a paired report against independent figures (and the declared expectation, when given).

    * both candidates' mean KLD equal ``independent_kld_means``: compensated (``math.fsum``) sums of
      the raw windowed position values, not the bootstrap module's bincount sums;
    * the studentized interval of the mean-KLD difference contains the difference of those means.
    """
    out = []
    d = rep["kld_mean"]
    ind = rep["independent_kld_means"]
    for side, name, mean in (("a", rep["a"], d["a"]), ("b", rep["b"], d["b"])):
        if abs(mean - ind[side]) > 1e-9 * max(abs(ind[side]), 1e-300):
            out.append(f"{rep['a']} vs {rep['b']}: mean KLD of {name} {mean!r} differs from the "
                       f"independent sum {ind[side]!r}")
    diff = ind["a"] - ind["b"]
    if d["ci95"] is not None and not d["ci95"][0] <= diff <= d["ci95"][1]:
        out.append(f"{rep['a']} vs {rep['b']}: difference {diff:.6g} (independent sums) outside its interval "
                   f"[{d['ci95'][0]:.6g}, {d['ci95'][1]:.6g}]")
    if expect is not None and rep["verdict"] != expect:
        ci = rep["kld_mean"]["ci95"]
        out.append(
            f"pair {pair_id(rep['a'], rep['b'])}: verdict {rep['verdict']!r}, expected {expect!r} "
            f"(mean KLD difference {rep['kld_mean']['diff']:.4g}, 95% interval "
            f"{'not estimable' if ci is None else f'[{ci[0]:.4g}, {ci[1]:.4g}]'}, margin ±{rep['margin']:g}; "
            f"smallest certifiable margin {_margin(rep)})" + (f"; WARNING: {rep['margin_warning']}" if rep.get("margin_warning") else "")
        )
    return out


def _close(x: float, y: float, rel: float) -> bool:
    return math.isclose(x, y, rel_tol=rel, abs_tol=1e-300)


def verify_paired(rep: PairedReport, path: str | Path, rows_a: Mapping[int, Sequence[ContextRow]],
                  rows_b: Mapping[int, Sequence[ContextRow]], margin: float | None = None,
                  n_boot: int | None = None) -> None:
    """Refuse a paired report (read back from ``path``) whose headline does not follow from the two candidates'
    shard reports (``rows_a``/``rows_b``: shard index -> per-context rows ``index``, ``cluster``, ``positions``,
    ``sum_kld``, ``mean_kld``) and the pair's ``margin`` and ``n_boot`` in the configuration (when given); the
    bootstrap seed and the fewest clusters for an interval are this harness's.

    Re-derived over the report's ``shards`` (else the shards both candidates have reports for): positions,
    clusters, both means and their difference, the 95 % interval of the difference (the same cluster
    bootstrap, its ``seed`` and ``n_boot``, on per-cluster sums), the context wins, the verdict under the
    margin and the certifiable margin. The p99/CVaR1%/top-1/EAR differences need the positions themselves
    and are not re-derived."""
    a, b = rep["a"], rep["b"]
    shards = rep.get("shards")
    if shards is None:
        shards = sorted(set(rows_a) & set(rows_b))
    missing = [s for s in shards if s not in rows_a or s not in rows_b]
    if not shards or missing:
        raise VerificationError(path, "shards", f"shards both {a} and {b} have reports for ({sorted(set(rows_a) & set(rows_b))})",
                                missing or shards)
    ra = [r for s in shards for r in rows_a[s]]
    rb = [r for s in shards for r in rows_b[s]]
    if [(r["index"], r["positions"]) for r in ra] != [(r["index"], r["positions"]) for r in rb]:
        raise VerificationError(path, f"positions of {a} and {b}", "the same contexts and positions in both shard reports", "others")
    if margin is not None and not _close(rep["margin"], margin, 1e-12):
        raise VerificationError(path, "margin", f"{margin!r} (the pair's margin in the configuration)", rep["margin"])
    n = sum(int(r["positions"]) for r in ra)
    names: dict[str, int] = {}
    cl = np.array([names.setdefault(str(r["cluster"]), len(names)) for r in ra], dtype=np.int64)
    pos_cl = np.bincount(cl, weights=[float(r["positions"]) for r in ra], minlength=len(names))
    diff_cl = np.bincount(cl, weights=[float(x["sum_kld"]) - float(y["sum_kld"]) for x, y in zip(ra, rb)], minlength=len(names))
    mean_a = math.fsum(float(r["sum_kld"]) for r in ra) / n
    mean_b = math.fsum(float(r["sum_kld"]) for r in rb) / n
    boot = rep["bootstrap"]
    if boot["seed"] != DEFAULT_SEED or (n_boot is not None and boot["n_boot"] != n_boot):
        raise VerificationError(path, "bootstrap", f"seed {DEFAULT_SEED}" + (f", n_boot {n_boot} (the configuration's)" if n_boot else ""),
                                f"seed {boot['seed']}, n_boot {boot['n_boot']}")
    ci = ratio_intervals(draw_cluster_weights(len(names), int(boot["n_boot"]), int(boot["seed"])), diff_cl, pos_cl)[0]
    rule = rep.get("margin_rule")
    if rule is not None:  # a relative or floor margin follows from the means (and the recorded floor)
        want_m, _ = resolve_margin(float(rule["value"]), str(rule["kind"]), mean_a, mean_b, rule["floor_mean"])
        if not _close(rep["margin"], want_m, 1e-9):
            raise VerificationError(path, "margin", f"{want_m!r} ({rule['kind']} margin {rule['value']!r})", rep["margin"])
    if "margin_warning" in rep and rep["margin_warning"] != margin_warning(rep["margin"], mean_a, mean_b):
        raise VerificationError(path, "margin_warning", repr(margin_warning(rep["margin"], mean_a, mean_b)), rep["margin_warning"])
    d = rep["kld_mean"]
    checks: list[tuple[str, float, float, float]] = [
        ("n_positions", n, rep["n_positions"], 0.0), ("n_clusters", len(names), rep["n_clusters"], 0.0),
        ("kld_mean.a", mean_a, d["a"], 1e-9), ("kld_mean.b", mean_b, d["b"], 1e-9), ("kld_mean.diff", mean_a - mean_b, d["diff"], 1e-7),
    ]
    for key, want, got, rel in checks:
        if not (want == got if rel == 0.0 else _close(float(got), float(want), rel) or abs(float(got) - float(want)) <= 1e-9 * abs(mean_a)):
            raise VerificationError(path, key, f"{want!r} (the shard reports of shards {list(shards)})", got)
    got_ci = d["ci95"]
    if (ci is None) != (got_ci is None) or (ci is not None and got_ci is not None and (
            len(got_ci) != 2 or not all(abs(float(g) - float(w)) <= 1e-6 * max(abs(float(w)), abs(mean_a)) for g, w in zip(got_ci, ci)))):
        raise VerificationError(path, "kld_mean.ci95", f"{ci!r} (re-derived from the shard reports)", got_ci)
    v = verdict(got_ci, rep["margin"])
    named = {"A better": f"{a} better", "B better": f"{b} better"}.get(v, v)
    certifiable = None if got_ci is None else max(-float(got_ci[0]), float(got_ci[1]))
    outcome: tuple[tuple[str, object, object], ...] = (
        ("verdict", v, rep["verdict"]), ("verdict_named", named, rep["verdict_named"]),
        ("certifiable_margin", certifiable, rep["certifiable_margin"]))
    for key, want_o, got_o in outcome:
        if want_o != got_o:
            raise VerificationError(path, key, f"{want_o!r} (from the interval and the margin)", got_o)
    wins: ContextWins = {"a_wins": sum(float(x["mean_kld"]) < float(y["mean_kld"]) for x, y in zip(ra, rb)),
            "b_wins": sum(float(y["mean_kld"]) < float(x["mean_kld"]) for x, y in zip(ra, rb)),
            "ties": sum(float(x["mean_kld"]) == float(y["mean_kld"]) for x, y in zip(ra, rb))}
    if rep["contexts"] != wins:
        raise VerificationError(path, "contexts", f"{wins} (the shard reports' per-context means)", rep["contexts"])


def _margin(rep: PairedReport) -> str:
    c = rep.get("certifiable_margin")
    return "—" if c is None else f"±{c:.4g}"


def render_paired(rep: PairedReport) -> str:
    a, b = rep["a"], rep["b"]
    bs = rep["bootstrap"]
    lines = [
        f"# Paired comparison: {a} vs {b}", "",
        f"**Verdict: {rep['verdict_named']}** (margin ±{rep['margin']:.4g} nats on the mean-KLD difference"
        + (f": {rule['text']}" if (rule := rep.get("margin_rule")) else "")
        + f"; the smallest margin these data could certify: {_margin(rep)})."
        + (f" **WARNING: {rep['margin_warning']}.**" if rep.get("margin_warning") else ""), "",
        f"Test: {rep['test']}.", "",
        f"{rep['n_positions']} positions in {rep['n_contexts']} contexts, {rep['n_clusters']} source clusters, "
        f"score_from={rep['score_from']}. Differences are {a} − {b}; means: {bs.get('method_text', bs['method'])}; "
        f"tails: {bs.get('tail_method', 'percentile')}; {bs['n_boot']} replicates "
        f"({bs['n_boot_tails']} for tails), seed {bs['seed']}.", "",
    ]
    rows = []
    for d, label in ((rep["kld_mean"], "mean KLD"), (rep["kld_p99"], "KLD p99"), (rep["kld_cvar1"], "KLD CVaR1%"),
                     (rep["top1"], "top-1 agreement"), (rep["ear_mean"], "EAR")):
        ci = "not estimable" if d["ci95"] is None else f"[{fmt_g(d['ci95'][0])}, {fmt_g(d['ci95'][1])}]"
        rows.append([label, fmt_g(d["a"]), fmt_g(d["b"]), fmt_g(d["diff"]), ci])
    lines += md_table(["metric", a, b, "difference", "95% interval"], rows)
    c = rep["contexts"]
    lines += ["", f"Contexts with lower mean KLD: {a} {c['a_wins']}, {b} {c['b_wins']}, ties {c['ties']}.", "",
              "Verdict rule: equivalent when the 95% interval lies inside ±margin (TOST, 2.5% per side); otherwise "
              "the side the interval excludes 0 on is better; else inconclusive. When the smallest certifiable margin "
              "exceeds the margin, 'not equivalent' may only mean too little data.", ""]
    return "\n".join(lines)


def write_paired(out_dir: str | Path, rep: PairedReport) -> tuple[Path, Path]:
    """Write ``<out>/paired/<a>-vs-<b>.json`` and ``.md`` atomically."""
    base = Path(out_dir) / "paired" / pair_id(rep["a"], rep["b"])
    atomic_write_files({base.with_suffix(".json"): dumps_json(rep), base.with_suffix(".md"): render_paired(rep)})  # both or neither
    return base.with_suffix(".json"), base.with_suffix(".md")
