"""Adaptive ladder (``--fidelity-adaptive``): stop scoring a candidate once its verdict is clear.

A candidate's shards are scored in order. After shard ``k`` of its ``K`` planned shards (a
*look*), the cumulative aggregate of the shards so far (per-context rows pooled, source-cluster
bootstrap, as in :mod:`harness.reports.aggregate`) gives a two-sided percentile interval of the token-mean
KLD at level ``1 - alpha/K``. When that interval lies entirely below or entirely above the
candidate's threshold ``T`` (its baseline's ``max_mean_kld``) and shards remain, the remaining
shard cases are skipped with the decision as the reason.

Rule (stated in every report): **Bonferroni alpha spending** — ``alpha = 0.05`` split equally over
the ``K`` planned looks (``alpha_k = alpha / K``). By the union bound the probability that *any*
look's interval excludes the true mean is at most ``alpha``, so the probability of stopping on the
wrong side of ``T`` is at most ``alpha`` (one wrong side: at most ``alpha/2``) whatever the
correlation between looks; the last look never stops early (every shard was scored). Because the
percentile bootstrap under-covers with few, skewed clusters at such extreme levels, the interval
is the wider (per side) of the percentile bootstrap and the cluster-robust Student-t interval
(linearized ratio, C - 1 degrees of freedom).
``tests/test_adaptive.py`` checks the rate in simulation at the worst case (true mean = T).

Threshold ``T``: the baseline's ``default.max_mean_kld`` when present, else the mean of the
per-shard ``max_mean_kld`` entries of the planned shards (all must exist); without one the
candidate is scored in full. The bootstrap uses at least ``20 / (alpha_k / 2)`` replicates so each
tail of the interval rests on at least 20 replicates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ALPHA = 0.05
RULE = (
    "adaptive ladder: shards scored in order; after look k of K the cumulative source-cluster bootstrap "
    "interval of the mean KLD at level 1 - alpha/K (Bonferroni alpha spending, alpha = 0.05; per side the wider "
    "of the percentile bootstrap and the cluster-robust t interval) is compared "
    "with the baseline's max_mean_kld; the candidate stops early when the interval lies entirely on one side."
)


def n_boot_for(alpha_k: float, n_boot: int) -> int:
    """Replicates for a percentile interval at level ``1 - alpha_k``: at least 20 in each tail."""
    return max(int(n_boot), int(math.ceil(20.0 / (alpha_k / 2.0))))


def cumulative_interval(rows: Sequence[dict[str, Any]], level: float, n_boot: int, seed: int) -> list[float]:
    """Percentile interval of the token-mean KLD over per-context rows (``cluster``, ``positions``, ``sum_kld``)."""
    from harness.metrics.bootstrap import draw_cluster_weights, percentile_interval, ratio_replicates

    clusters = sorted({str(r["cluster"]) for r in rows})
    pos = {c: i for i, c in enumerate(clusters)}
    idx = np.array([pos[str(r["cluster"])] for r in rows], dtype=np.int64)
    C = len(clusters)
    sums = np.bincount(idx, weights=np.array([float(r["sum_kld"]) for r in rows]), minlength=C)
    counts = np.bincount(idx, weights=np.array([float(r["positions"]) for r in rows]), minlength=C)
    W = draw_cluster_weights(C, n_boot, seed)
    lo, hi = percentile_interval(ratio_replicates(W, sums, counts), level)
    if C >= 2:  # the wider of the bootstrap and the cluster-robust t interval (few, skewed clusters)
        from scipy.stats import t as student_t

        ratio = sums.sum() / counts.sum()
        resid = (sums - ratio * counts) / counts.mean()
        se = math.sqrt(float((resid**2).sum()) / (C - 1) / C)
        q = float(student_t.ppf(1.0 - (1.0 - level) / 2.0, C - 1))
        lo, hi = min(lo, ratio - q * se), max(hi, ratio + q * se)
    return [max(float(lo), 0.0), float(hi)]  # KLD >= 0


@dataclass(frozen=True)
class Decision:
    """The outcome of one look."""

    look: int
    looks: int
    level: float
    ci: tuple[float, float]
    mean_kld: float
    threshold: float | None
    side: str | None  # "below" (passes), "above" (fails) or None (continue)

    @property
    def stop(self) -> bool:
        return self.side is not None and self.look < self.looks

    def describe(self) -> str:
        lo, hi = self.ci
        where = {"below": "entirely below", "above": "entirely above"}.get(self.side or "", "not clear of")
        return (f"look {self.look}/{self.looks}: mean KLD {self.mean_kld:.4g}, {100 * self.level:.2f}% interval "
                f"[{lo:.4g}, {hi:.4g}] {where} max_mean_kld {self.threshold if self.threshold is None else f'{self.threshold:.4g}'}")


def decide(rows: Sequence[dict[str, Any]], look: int, looks: int, threshold: float | None, *,
           alpha: float = ALPHA, n_boot: int = 2000, seed: int = 20240601) -> Decision:
    """One look: the interval at level ``1 - alpha/looks`` and on which side of ``threshold`` it lies."""
    alpha_k = alpha / looks
    level = 1.0 - alpha_k
    lo, hi = cumulative_interval(rows, level, n_boot_for(alpha_k, n_boot), seed)
    mean = math.fsum(float(r["sum_kld"]) for r in rows) / sum(int(r["positions"]) for r in rows)
    side = None
    if threshold is not None:
        side = "below" if hi < threshold else ("above" if lo > threshold else None)
    return Decision(look, looks, level, (lo, hi), mean, threshold, side)


def threshold_for(baselines_dir: Any, candidate: str, shards: Sequence[int]) -> float | None:
    """``T`` of a candidate (see the module docstring), or None."""
    from harness.gate.baselines import load_baseline_or_none

    b = load_baseline_or_none(baselines_dir, candidate)
    if b is None:
        return None
    if "max_mean_kld" in b.default:
        return b.default["max_mean_kld"]
    found = [b.thresholds(s).get("max_mean_kld") for s in shards]
    vals = [v for v in found if v is not None]
    if not vals or len(vals) != len(found):
        return None
    return float(np.mean(vals))


@dataclass
class AdaptiveMonitor:
    """Per-process adaptive state: planned shards, rows seen so far, and stop decisions."""

    planned: dict[str, list[int]]
    thresholds: dict[str, float | None]
    n_boot: int = 2000
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    seen: dict[str, list[int]] = field(default_factory=dict)
    stopped: dict[str, Decision] = field(default_factory=dict)

    def stop_reason(self, candidate: str) -> str | None:
        d = self.stopped.get(candidate)
        if d is None:
            return None
        verdict = "passes" if d.side == "below" else "fails"
        return f"adaptive stop ({candidate} {verdict}): {d.describe()}; alpha spent {ALPHA}/{d.looks} per look"

    def observe(self, candidate: str, shard: int, metrics: Mapping[str, Any]) -> Decision:
        """Record a scored shard (its report's ``metrics``) and take a look."""
        self.rows.setdefault(candidate, []).extend(metrics["contexts"])
        self.seen.setdefault(candidate, []).append(int(shard))
        looks = len(self.planned.get(candidate, [])) or 1
        seed = int(metrics.get("bootstrap", {}).get("seed", 20240601))
        d = decide(self.rows[candidate], len(self.seen[candidate]), looks, self.thresholds.get(candidate),
                   n_boot=self.n_boot, seed=seed)
        if d.stop:
            self.stopped[candidate] = d
        return d


def render_adaptive(records: Sequence[dict[str, Any]]) -> str:
    """``adaptive.md``: the rule and each candidate's looks."""
    lines = ["# Adaptive ladder", "", RULE, ""]
    lines += ["| candidate | shard | look | mean KLD | interval | level | max_mean_kld | decision |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (r["candidate"], r["look"])):
        lo, hi = r["ci"]
        t = "—" if r["threshold"] is None else f"{r['threshold']:.4g}"
        dec = {"below": "stop: passes", "above": "stop: fails"}.get(r["side"] or "", "continue")
        if r["side"] and r["look"] >= r["looks"]:
            dec = "final look (" + ("below" if r["side"] == "below" else "above") + ")"
        lines.append(f"| {r['candidate']} | {r['shard']:02d} | {r['look']}/{r['looks']} | {r['mean_kld']:.4g} | "
                     f"[{lo:.4g}, {hi:.4g}] | {100 * r['level']:.2f}% | {t} | {dec} |")
    return "\n".join(lines) + "\n"


def write_adaptive(out_dir: Any, records: Sequence[dict[str, Any]]) -> None:
    from pathlib import Path

    from harness.io.atomic import atomic_write_files, dumps_json

    out = Path(out_dir)
    doc = {"schema": "fidelity.adaptive/1", "rule": RULE, "alpha": ALPHA,
           "looks": sorted(records, key=lambda r: (r["candidate"], r["look"]))}
    atomic_write_files({out / "adaptive.json": dumps_json(doc), out / "adaptive.md": render_adaptive(records)})  # both or neither
