"""Adaptive ladder (``--fidelity-adaptive``): stop scoring a candidate once its verdict is clear.

A candidate's shards are scored in order. After shard ``k`` of its ``K`` planned shards (a
*look*), the cumulative aggregate of the shards so far (per-context rows pooled by source cluster,
as in :mod:`harness.reports.aggregate`) gives a one-sided lower and a one-sided upper bound of the
token-mean KLD. When the upper bound lies below the candidate's threshold ``T`` (its baseline's
``max_mean_kld``) the candidate *passes* early; when the lower bound lies above ``T`` it *fails*
early; the remaining shard cases are skipped with the decision as the reason.

Reasoning: docs/statistics.md §"The adaptive ladder's stopping rule".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from harness.errors import VerificationError
from harness.gate.baselines import load_baseline_or_none
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.md_table import md_table
from harness.io.schema import Closed, Nullable, OneOf, check
from harness.metrics.bootstrap import SMALL_SAMPLE_CLUSTERS, draw_cluster_weights, effective_clusters, ratio_intervals

ALPHA = 0.05
#: Error budget of each side: an early wrong pass, and separately an early wrong fail.
ALPHA_SIDE = ALPHA / 2.0
#: Fewest cumulative source clusters at which a look may stop early.
MIN_EARLY_CLUSTERS = 40
RULE = (
    "adaptive ladder: shards scored in order; each look compares a one-sided studentized source-cluster bootstrap "
    "bound of the cumulative mean KLD with the baseline's max_mean_kld. Early pass when the upper bound is below it, "
    f"early fail when the lower bound is above it; each side's error <= {ALPHA_SIDE} (alpha = {ALPHA}), split "
    f"equally (Bonferroni) over the looks that may stop: those with >= {MIN_EARLY_CLUSTERS} cumulative source "
    "clusters, before the last look."
)


def n_boot_for(alpha_k: float, n_boot: int, n_clusters: float) -> int:
    """Replicates drawn up front for a one-sided bound at level ``1 - alpha_k`` over ``n_clusters`` (effective)
    clusters: at least 20 beyond a quantile read at ``alpha_k C' / (C' + K)``. A planning count only: the level each
    side is read at comes from :func:`~harness.metrics.bootstrap.side_levels`, and where it needs more replicates
    ``ratio_intervals`` extends these draws (:func:`~harness.metrics.bootstrap.read_rows`)."""
    return max(int(n_boot), int(math.ceil(20.0 * (n_clusters + SMALL_SAMPLE_CLUSTERS) / (alpha_k * n_clusters) - 1e-9)))


def alpha_per_look(looks: int, first_look: int | None) -> float | None:
    """Each side's level ``alpha_k`` at the looks that may stop (None: no look may stop)."""
    if first_look is None or first_look >= looks:
        return None
    return ALPHA_SIDE / (looks - first_look)


def look_bounds(sums: np.ndarray, counts: np.ndarray, alpha_k: float, n_boot: int, seed: int) -> np.ndarray:
    """One-sided bounds ``[k, 2]`` (lower at ``alpha_k``, upper at ``alpha_k``) of the mean KLD.

    ``sums``: per-cluster KLD sums ``[C]`` or ``[C, k]`` (k data sets on the same clusters: the
    simulations), ``counts``: positions per cluster ``[C]``."""
    C = int(np.asarray(counts).shape[0])
    W = draw_cluster_weights(C, n_boot_for(alpha_k, n_boot, effective_clusters(np.asarray(counts))), seed)
    ivs = ratio_intervals(W, sums, counts, alpha_lo=alpha_k, alpha_hi=alpha_k, bounds=(0.0, math.inf))
    return np.array([iv if iv is not None else [0.0, math.inf] for iv in ivs], dtype=np.float64)


def side_of(lo: float, hi: float, threshold: float | None) -> str | None:
    """``below`` (upper bound under ``T``: passes), ``above`` (lower bound over ``T``: fails) or None."""
    if threshold is None:
        return None
    return "below" if hi < threshold else ("above" if lo > threshold else None)


def cluster_totals(rows: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster KLD sums and positions from per-context rows (``cluster``, ``positions``, ``sum_kld``)."""
    clusters = sorted({str(r["cluster"]) for r in rows})
    pos = {c: i for i, c in enumerate(clusters)}
    idx = np.array([pos[str(r["cluster"])] for r in rows], dtype=np.int64)
    C = len(clusters)
    sums = np.bincount(idx, weights=np.array([float(r["sum_kld"]) for r in rows]), minlength=C)
    counts = np.bincount(idx, weights=np.array([float(r["positions"]) for r in rows]), minlength=C)
    return sums, counts



class LookRecord(TypedDict):
    """One look of the adaptive rule as ``adaptive.json`` records it (:meth:`Decision.record`)."""

    look: int
    looks: int
    level: float
    alpha_k: float | None
    clusters: int
    ci: list[float] | None
    mean_kld: float
    threshold: float | None
    #: "below" (passes), "above" (fails) or None (continue)
    side: str | None


class AdaptiveRecord(LookRecord):
    """A look of one candidate after one shard (the payload of the ``adaptive`` report kind)."""

    candidate: str
    shard: int

@dataclass(frozen=True)
class Decision:
    """The outcome of one look.

    ``alpha_k``: each side's level at this look (None: this look may not stop); ``level``: the
    two-sided level ``1 - 2 alpha_k`` of ``ci`` (the two one-sided bounds); ``clusters``: cumulative
    source clusters."""

    look: int
    looks: int
    level: float
    ci: tuple[float, float] | None
    mean_kld: float
    threshold: float | None
    side: str | None  # "below" (passes), "above" (fails) or None (continue)
    clusters: int = 0
    alpha_k: float | None = None

    @property
    def stop(self) -> bool:
        return self.side is not None and self.alpha_k is not None and self.look < self.looks

    def record(self) -> LookRecord:
        """The JSON-ready record of this look (``adaptive.json``)."""
        return {"look": self.look, "looks": self.looks, "level": self.level, "alpha_k": self.alpha_k,
                "clusters": self.clusters, "ci": None if self.ci is None else list(self.ci), "mean_kld": self.mean_kld,
                "threshold": self.threshold, "side": self.side}

    def describe(self) -> str:
        where = {"below": "entirely below", "above": "entirely above"}.get(self.side or "", "not clear of")
        if self.alpha_k is None or self.ci is None:
            return (f"look {self.look}/{self.looks}: mean KLD {self.mean_kld:.4g} over {self.clusters} clusters "
                    f"(no early stop at this look: < {MIN_EARLY_CLUSTERS} clusters or the last look)")
        lo, hi = self.ci
        return (f"look {self.look}/{self.looks}: mean KLD {self.mean_kld:.4g}, one-sided bounds at alpha {self.alpha_k:.4g} "
                f"per side [{lo:.4g}, {hi:.4g}] {where} max_mean_kld "
                f"{self.threshold if self.threshold is None else f'{self.threshold:.4g}'} ({self.clusters} clusters)")


def decide(rows: Sequence[dict[str, Any]], look: int, looks: int, threshold: float | None, *,
           first_look: int | None = None, n_boot: int = 2000, seed: int = 20240601) -> Decision:
    """One look. ``first_look``: the first look with >= :data:`MIN_EARLY_CLUSTERS` clusters (this
    look when it is the first such and None is given)."""
    sums, counts = cluster_totals(rows)
    C = int(counts.shape[0])
    mean = math.fsum(float(r["sum_kld"]) for r in rows) / sum(int(r["positions"]) for r in rows)
    if first_look is None and C >= MIN_EARLY_CLUSTERS:
        first_look = look
    alpha_k = alpha_per_look(looks, first_look) if (C >= MIN_EARLY_CLUSTERS and look < looks) else None
    if alpha_k is None:
        return Decision(look, looks, 1.0, None, mean, threshold, None, C, None)
    lo, hi = (float(x) for x in look_bounds(sums, counts, alpha_k, n_boot, seed)[0])
    return Decision(look, looks, 1.0 - 2.0 * alpha_k, (lo, hi), mean, threshold, side_of(lo, hi, threshold), C, alpha_k)


def threshold_for(baselines_dir: Any, candidate: str, shards: Sequence[int]) -> float | None:
    """``T`` of a candidate (see docs/statistics.md §"The adaptive ladder's stopping rule"), or None."""
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
    first_look: dict[str, int] = field(default_factory=dict)

    def stop_reason(self, candidate: str) -> str | None:
        d = self.stopped.get(candidate)
        if d is None:
            return None
        verdict = "passes" if d.side == "below" else "fails"
        return f"adaptive stop ({candidate} {verdict}): {d.describe()}; each side's error <= {ALPHA_SIDE}"

    def observe(self, candidate: str, shard: int, metrics: Mapping[str, Any]) -> Decision:
        """Record a scored shard (its report's ``metrics``) and take a look."""
        self.rows.setdefault(candidate, []).extend(metrics["contexts"])
        self.seen.setdefault(candidate, []).append(int(shard))
        looks = len(self.planned.get(candidate, [])) or 1
        seed = int(metrics.get("bootstrap", {}).get("seed", 20240601))
        d = decide(self.rows[candidate], len(self.seen[candidate]), looks, self.thresholds.get(candidate),
                   first_look=self.first_look.get(candidate), n_boot=self.n_boot, seed=seed)
        if d.clusters >= MIN_EARLY_CLUSTERS:
            self.first_look.setdefault(candidate, d.look)
        if d.stop:
            self.stopped[candidate] = d
        return d


#: ``adaptive.json`` as the harness reads it back (harness.io.schema): closed, this version, this rule.
LOOK_SCHEMA = Closed({"candidate": str, "shard": int, "look": int, "looks": int, "level": float, "alpha_k": Nullable(float),
                      "clusters": int, "ci": Nullable([float]), "mean_kld": float, "threshold": Nullable(float),
                      "side": OneOf(None, "below", "above")})
ADAPTIVE_SCHEMA = Closed({"schema": OneOf("fidelity.adaptive/1"), "rule": OneOf(RULE), "alpha": OneOf(ALPHA),
                          "alpha_side": OneOf(ALPHA_SIDE), "min_early_clusters": OneOf(MIN_EARLY_CLUSTERS),
                          "looks": [LOOK_SCHEMA]})


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)


def check_adaptive(doc: Any, path: Any, rows: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]]) -> None:
    """Refuse an ``adaptive.json`` (``doc``, read from ``path``) that does not match :data:`ADAPTIVE_SCHEMA` or
    does not follow from the shard reports it describes. ``rows``: per candidate, per shard index, the
    report's per-context rows (``cluster``, ``positions``, ``sum_kld``).

    Each candidate's looks are numbered 1, 2, ... with one ``looks`` total and distinct shards that it has
    reports for; a look's ``mean_kld`` and ``clusters`` are those of the shards up to it; its ``level``,
    ``ci`` and ``alpha_k`` agree; its ``side`` is what its bounds say about its ``threshold``."""
    check(doc, ADAPTIVE_SCHEMA, path)
    by_cand: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, r in enumerate(doc["looks"]):
        by_cand.setdefault(r["candidate"], []).append((i, r))
    for cand, looks in by_cand.items():
        if cand not in rows:
            raise VerificationError(path, f"looks[{looks[0][0]}].candidate", f"a candidate with shard reports ({', '.join(sorted(rows)) or 'none'})", cand)
        seen: list[int] = []
        for n, (i, r) in enumerate(sorted(looks, key=lambda x: x[1]["look"]), start=1):
            at = f"looks[{i}]"
            if r["look"] != n:
                raise VerificationError(path, f"{at}.look", f"look {n} of {cand}", r["look"])
            if r["looks"] != looks[0][1]["looks"] or not n <= r["looks"]:
                raise VerificationError(path, f"{at}.looks", f"one total >= {n} for {cand}", r["looks"])
            if r["shard"] in seen or r["shard"] not in rows[cand]:
                raise VerificationError(path, f"{at}.shard", f"a shard {cand} has a report for, once ({sorted(rows[cand])})", r["shard"])
            seen.append(r["shard"])
            cum = [row for s in seen for row in rows[cand][s]]
            mean = math.fsum(float(x["sum_kld"]) for x in cum) / max(1, sum(int(x["positions"]) for x in cum))
            if not _close(r["mean_kld"], mean):
                raise VerificationError(path, f"{at}.mean_kld", f"{mean!r} (shards {seen} of {cand}'s reports)", r["mean_kld"])
            clusters = len({str(x["cluster"]) for x in cum})
            if r["clusters"] != clusters:
                raise VerificationError(path, f"{at}.clusters", f"{clusters} (shards {seen} of {cand}'s reports)", r["clusters"])
            ci, a = r["ci"], r["alpha_k"]
            if (ci is None) != (a is None) or (ci is not None and (len(ci) != 2 or ci[0] > ci[1])):
                raise VerificationError(path, f"{at}.ci", "[lower, upper] with alpha_k, or null with alpha_k null", ci)
            level = 1.0 if a is None else 1.0 - 2.0 * a
            if a is not None and not 0.0 < a <= ALPHA_SIDE or not _close(r["level"], level):
                raise VerificationError(path, f"{at}.level", f"1 - 2 alpha_k = {level!r} (0 < alpha_k <= {ALPHA_SIDE})", r["level"])
            side = None if ci is None else side_of(ci[0], ci[1], r["threshold"])
            if r["side"] != side:
                raise VerificationError(path, f"{at}.side", f"{json.dumps(side)} (its bounds {ci} and threshold {r['threshold']})",
                                        json.dumps(r["side"]))


def render_adaptive(records: Sequence[AdaptiveRecord]) -> str:
    """``adaptive.md``: the rule and each candidate's looks."""
    lines = ["# Adaptive ladder", "", RULE, ""]
    rows = []
    for r in sorted(records, key=lambda r: (r["candidate"], r["look"])):
        t = "—" if r["threshold"] is None else f"{r['threshold']:.4g}"
        dec = {"below": "stop: passes", "above": "stop: fails"}.get(r["side"] or "", "continue")
        ci = r.get("ci")
        if ci is None:
            bounds, a, dec = "—", "—", "continue (may not stop at this look)"
        else:
            bounds, a = f"[{ci[0]:.4g}, {ci[1]:.4g}]", f"{r['alpha_k']:.4g}"
        rows.append([r["candidate"], f"{r['shard']:02d}", f"{r['look']}/{r['looks']}", r.get("clusters", "—"),
                     f"{r['mean_kld']:.4g}", bounds, a, t, dec])
    lines += md_table(["candidate", "shard", "look", "clusters", "mean KLD", "one-sided bounds", "alpha per side",
                       "max_mean_kld", "decision"], rows)
    return "\n".join(lines) + "\n"


def write_adaptive(out_dir: Any, records: Sequence[AdaptiveRecord]) -> None:
    from pathlib import Path

    out = Path(out_dir)
    doc = {"schema": "fidelity.adaptive/1", "rule": RULE, "alpha": ALPHA, "alpha_side": ALPHA_SIDE,
           "min_early_clusters": MIN_EARLY_CLUSTERS, "looks": sorted(records, key=lambda r: (r["candidate"], r["look"]))}
    atomic_write_files({out / "adaptive.json": dumps_json(doc), out / "adaptive.md": render_adaptive(records)})  # both or neither
