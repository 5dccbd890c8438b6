"""Paired comparisons of two candidates (``pytest -m paired``, ``fidelity paired``).

Both candidates are scored on the *same* positions; :func:`harness.metrics.paired` bootstraps the
difference ``a - b`` of mean KLD, p99, CVaR1%, top-1 and EAR with common random numbers (the same
cluster draws for both). The verdict is decided on the mean-KLD difference and the pair's
equivalence margin ``m`` (nats, ``[[pairs]] margin`` in ``fidelity.toml``), checked in this order:

* ``equivalent`` — the whole 95% interval of the difference lies inside ``[-m, +m]``;
* ``A better`` — the interval lies entirely below 0 (a's KLD is lower) and not equivalent;
* ``B better`` — the interval lies entirely above 0 and not equivalent;
* ``inconclusive`` — otherwise (the interval straddles 0 but is wider than the margin allows).

``A``/``B`` are printed with the candidates' names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = "fidelity.paired/1"
VERDICTS = ("equivalent", "A better", "B better", "inconclusive")


def verdict(ci: Sequence[float], margin: float) -> str:
    """The verdict from the 95% interval of the mean-KLD difference a - b and the margin (see module docs)."""
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
    from harness.errors import FidelityError
    from harness.metrics import paired
    from harness.scoring.scores import PositionScores

    for pa, pb in zip(pos_a, pos_b):
        if not (np.array_equal(pa.context_index, pb.context_index) and np.array_equal(pa.row, pb.row)):
            raise FidelityError(f"paired {a} vs {b}: the two candidates were not scored on the same positions")
    if len(pos_a) != len(pos_b):
        raise FidelityError(f"paired {a} vs {b}: {len(pos_a)} and {len(pos_b)} shards")
    sa = PositionScores.concat([p.scores for p in pos_a])
    sb = PositionScores.concat([p.scores for p in pos_b])
    ctx = np.concatenate([p.context_index for p in pos_a])
    row = np.concatenate([p.row for p in pos_a])
    labels = [lab for p in pos_a for lab in p.labels]
    res = paired(sa, sb, ctx, row, labels, score_from=score_from, n_boot=n_boot)
    v = verdict(res["kld_mean"]["ci95"], margin)
    named = {"A better": f"{a} better", "B better": f"{b} better"}.get(v, v)
    return {"schema": SCHEMA, "a": a, "b": b, "margin": float(margin), "verdict": v, "verdict_named": named, **res}


def check_paired(rep: dict[str, Any], expect: str | None = None) -> list[str]:
    """Consistency of a paired report (and the declared expectation, when given)."""
    out = []
    for key in ("kld_mean", "top1", "ear_mean"):
        d = rep[key]
        if abs((d["a"] - d["b"]) - d["diff"]) > 1e-12 * max(1.0, abs(d["a"]), abs(d["b"])):
            out.append(f"{rep['a']} vs {rep['b']}: {key} difference {d['diff']} != a - b")
        lo, hi = d["ci95"]
        if not lo <= hi:
            out.append(f"{rep['a']} vs {rep['b']}: {key} interval [{lo}, {hi}] is not ordered")
    if expect is not None and rep["verdict"] != expect:
        lo, hi = rep["kld_mean"]["ci95"]
        out.append(
            f"pair {pair_id(rep['a'], rep['b'])}: verdict {rep['verdict']!r}, expected {expect!r} "
            f"(mean KLD difference {rep['kld_mean']['diff']:.4g}, 95% interval [{lo:.4g}, {hi:.4g}], margin ±{rep['margin']:g})"
        )
    return out


def render_paired(rep: dict[str, Any]) -> str:
    from harness.reports.numbers import fmt_g

    a, b = rep["a"], rep["b"]
    bs = rep["bootstrap"]
    lines = [
        f"# Paired comparison: {a} vs {b}", "",
        f"**Verdict: {rep['verdict_named']}** (margin ±{rep['margin']:g} nats on the mean-KLD difference).", "",
        f"{rep['n_positions']} positions in {rep['n_contexts']} contexts, {rep['n_clusters']} source clusters, "
        f"score_from={rep['score_from']}. Differences are {a} − {b}; {bs['method']}, {bs['n_boot']} replicates "
        f"({bs['n_boot_tails']} for tails), seed {bs['seed']}.", "",
        f"| metric | {a} | {b} | difference | 95% interval |", "|---|---|---|---|---|",
    ]
    for key, label in (("kld_mean", "mean KLD"), ("kld_p99", "KLD p99"), ("kld_cvar1", "KLD CVaR1%"),
                       ("top1", "top-1 agreement"), ("ear_mean", "EAR")):
        d = rep[key]
        lines.append(f"| {label} | {fmt_g(d['a'])} | {fmt_g(d['b'])} | {fmt_g(d['diff'])} | [{fmt_g(d['ci95'][0])}, {fmt_g(d['ci95'][1])}] |")
    c = rep["contexts"]
    lines += ["", f"Contexts with lower mean KLD: {a} {c['a_wins']}, {b} {c['b_wins']}, ties {c['ties']}.", "",
              "Verdict rule: equivalent when the interval lies inside ±margin; otherwise the side the interval "
              "excludes 0 on is better; else inconclusive.", ""]
    return "\n".join(lines)


def write_paired(out_dir: str | Path, rep: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``<out>/paired/<a>-vs-<b>.json`` and ``.md`` atomically."""
    from harness.io.atomic import atomic_write_files, dumps_json

    base = Path(out_dir) / "paired" / pair_id(rep["a"], rep["b"])
    atomic_write_files({base.with_suffix(".json"): dumps_json(rep), base.with_suffix(".md"): render_paired(rep)})  # both or neither
    return base.with_suffix(".json"), base.with_suffix(".md")
