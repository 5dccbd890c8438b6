"""Paired comparisons of two candidates (``pytest fidelity.toml -m fidelity_paired``, ``fidelity paired``).

Both candidates are scored on the *same* positions; :func:`harness.metrics.paired` bootstraps the
difference ``a - b`` of mean KLD, p99, CVaR1%, top-1 and EAR with common random numbers (the same
cluster draws for both). The verdict is decided on the mean-KLD difference ``d = a - b``, its 95%
studentized interval ``[lo, hi]`` and the pair's equivalence margin ``m`` (nats, ``[[pairs]]
margin`` in ``fidelity.toml``), checked in this order:

* ``not estimable`` — fewer source clusters than an interval needs (no verdict);
* ``equivalent`` — ``-m <= lo`` and ``hi <= m``: the **TOST** equivalence test (two one-sided
  tests) at level :data:`ALPHA_SIDE` = 0.05 per side: when the true difference is ``+m`` (or
  ``-m``), "equivalent" is said with probability at most 5 %. The rule reads the *95 %* interval
  (a 2.5 % bound per side), not the 90 % one an exact TOST at 5 % would read: differences of KLD are
  skewed, and with few clusters the margin side of even a studentized bound misses more often
  than stated (measured up to 3.8 % for a 2.5 % bound at 16 clusters, ``docs/statistics.md``);
  the stricter bound keeps the stated 5 % with room to spare;
* ``A better`` — ``hi < 0`` (a's KLD is lower), not equivalent: a two-sided test of ``d = 0`` at 5 %;
* ``B better`` — ``lo > 0``, not equivalent;
* ``inconclusive`` — otherwise (the interval straddles 0 but is wider than the margin allows).

Every report also gives ``certifiable_margin = max(-lo, hi)``: the smallest margin at which these
data would be called equivalent. When it exceeds ``m``, "not equivalent" may only mean that the
suite is too small to certify ``m``. ``A``/``B`` are printed with the candidates' names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import FidelityError
from harness.io.atomic import atomic_write_files, dumps_json
from harness.metrics import paired
from harness.metrics.scores import PositionScores
from harness.reports.numbers import fmt_g

SCHEMA = "fidelity.paired/1"
VERDICTS = ("equivalent", "A better", "B better", "inconclusive", "not estimable")
#: Level of each one-sided test of the equivalence (TOST) verdict.
ALPHA_SIDE = 0.05
TEST = (f"equivalent: TOST at alpha {ALPHA_SIDE} per side, read conservatively from the 95% studentized interval of the "
        "mean-KLD difference (it lies within ±margin); better: the interval excludes 0 (two-sided, 5%)")


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


def pair_id(a: str, b: str) -> str:
    return f"{a}-vs-{b}"


def paired_report(
    a: str, b: str, pos_a: Sequence[Any], pos_b: Sequence[Any], *, margin: float, score_from: int = 0,
    n_boot: int = 10_000,
) -> dict[str, Any]:
    """Paired comparison of ``a`` and ``b`` from their :class:`~harness.run.shard.ShardPositions` (same shards, same order)."""
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
    v = verdict(ci, margin)
    named = {"A better": f"{a} better", "B better": f"{b} better"}.get(v, v)
    certifiable = None if ci is None else max(-float(ci[0]), float(ci[1]))
    return {"schema": SCHEMA, "a": a, "b": b, "margin": float(margin), "verdict": v, "verdict_named": named,
            "test": TEST, "alpha_per_side": ALPHA_SIDE, "certifiable_margin": certifiable,
            "independent_kld_means": fsum, **res}


def check_paired(rep: dict[str, Any], expect: str | None = None) -> list[str]:
    """Checks of a paired report against independent figures (and the declared expectation, when given).

    * both candidates' mean KLD equal ``independent_kld_means``: compensated (``math.fsum``) sums of
      the raw windowed position values, not the bootstrap module's bincount sums;
    * the studentized interval of the mean-KLD difference contains the difference of those means.
    """
    out = []
    d = rep["kld_mean"]
    ind = rep["independent_kld_means"]
    for side in ("a", "b"):
        if abs(d[side] - ind[side]) > 1e-9 * max(abs(ind[side]), 1e-300):
            out.append(f"{rep['a']} vs {rep['b']}: mean KLD of {rep[side]} {d[side]!r} differs from the "
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
            f"smallest certifiable margin {_margin(rep)})"
        )
    return out


def _margin(rep: dict[str, Any]) -> str:
    c = rep.get("certifiable_margin")
    return "—" if c is None else f"±{c:.4g}"


def render_paired(rep: dict[str, Any]) -> str:
    a, b = rep["a"], rep["b"]
    bs = rep["bootstrap"]
    lines = [
        f"# Paired comparison: {a} vs {b}", "",
        f"**Verdict: {rep['verdict_named']}** (margin ±{rep['margin']:g} nats on the mean-KLD difference; the smallest "
        f"margin these data could certify: {_margin(rep)}).", "",
        f"Test: {rep['test']}.", "",
        f"{rep['n_positions']} positions in {rep['n_contexts']} contexts, {rep['n_clusters']} source clusters, "
        f"score_from={rep['score_from']}. Differences are {a} − {b}; means: {bs.get('method_text', bs['method'])}; "
        f"tails: {bs.get('tail_method', 'percentile')}; {bs['n_boot']} replicates "
        f"({bs['n_boot_tails']} for tails), seed {bs['seed']}.", "",
        f"| metric | {a} | {b} | difference | 95% interval |", "|---|---|---|---|---|",
    ]
    for key, label in (("kld_mean", "mean KLD"), ("kld_p99", "KLD p99"), ("kld_cvar1", "KLD CVaR1%"),
                       ("top1", "top-1 agreement"), ("ear_mean", "EAR")):
        d = rep[key]
        ci = "not estimable" if d["ci95"] is None else f"[{fmt_g(d['ci95'][0])}, {fmt_g(d['ci95'][1])}]"
        lines.append(f"| {label} | {fmt_g(d['a'])} | {fmt_g(d['b'])} | {fmt_g(d['diff'])} | {ci} |")
    c = rep["contexts"]
    lines += ["", f"Contexts with lower mean KLD: {a} {c['a_wins']}, {b} {c['b_wins']}, ties {c['ties']}.", "",
              "Verdict rule: equivalent when the 95% interval lies inside ±margin (TOST, 5% per side); otherwise "
              "the side the interval excludes 0 on is better; else inconclusive. When the smallest certifiable margin "
              "exceeds the margin, 'not equivalent' may only mean too little data.", ""]
    return "\n".join(lines)


def write_paired(out_dir: str | Path, rep: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``<out>/paired/<a>-vs-<b>.json`` and ``.md`` atomically."""
    base = Path(out_dir) / "paired" / pair_id(rep["a"], rep["b"])
    atomic_write_files({base.with_suffix(".json"): dumps_json(rep), base.with_suffix(".md"): render_paired(rep)})  # both or neither
    return base.with_suffix(".json"), base.with_suffix(".md")
