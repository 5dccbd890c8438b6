"""The published ladder's figures re-derived from its receipts' rows, and this project's reading beside them.

Per candidate (:func:`candidate_figures`): the token mean and top-1 (position-weighted ``math.fsum`` of the
rows), the context-macro mean and the published percentile interval (:mod:`harness.interchange.bootstrap_method`,
the receipt's own samples and seed), each compared with the receipt's printed value; beside them this
project's studentized source-cluster interval of the token mean (:func:`harness.metrics.bootstrap.ratio_intervals`).
Per comparison of a paired receipt (:func:`paired_figures`): the mean of per-context differences, its
percentile interval, wins and ties, compared exactly; beside them the studentized interval of the token-mean
difference (one draw for both sides) and the verdict of :func:`harness.reports.paired.verdict` at a margin.
A re-derived figure that differs from the printed one is refused naming the receipt and the field.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import VerificationError
from harness.interchange.bootstrap_method import percentile_bootstrap
from harness.interchange.ladder_receipts import CumulativeReceipt, ReceiptRow
from harness.io.hashing import sha256_file
from harness.metrics.bootstrap import DEFAULT_N_BOOT, DEFAULT_SEED, draw_cluster_weights, ratio_intervals
from harness.reports.paired import verdict

#: The published tool's percentile interval, by name (what a ``published`` column shows).
PUBLISHED_INTERVAL = "percentile source-cluster bootstrap of the context-macro mean"


def _exact(path: str | Path, what: str, printed: Any, derived: Any) -> None:
    if printed != derived:
        raise VerificationError(path, f"{what} (re-derived from the rows by the published method)", derived, printed)


def _cluster_arrays(rows: Sequence[ReceiptRow], values: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Positions per source cluster (sorted names) and each ``values`` array (one entry per row) summed per cluster."""
    names = sorted({r.source_cluster for r in rows})
    pos = {c: i for i, c in enumerate(names)}
    idx = np.array([pos[r.source_cluster] for r in rows], dtype=np.int64)
    counts = np.bincount(idx, weights=np.array([r.positions for r in rows], dtype=np.float64), minlength=len(names))
    return counts, [np.bincount(idx, weights=v, minlength=len(names)) for v in values]


def own_interval(rows: Sequence[ReceiptRow], n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED) -> list[float] | None:
    """This project's 95 % studentized source-cluster interval of the token mean KLD of ``rows``."""
    counts, (sums,) = _cluster_arrays(rows, [np.array([r.mean_kld * r.positions for r in rows])])
    W = draw_cluster_weights(counts.size, n_boot, seed)
    return ratio_intervals(W, sums, counts, bounds=(0.0, math.inf))[0]


def candidate_figures(rc: CumulativeReceipt, selection: frozenset[int] | None = None, n_boot: int = DEFAULT_N_BOOT) -> dict[str, Any]:
    """One candidate's figures from its rows (module docstring); ``selection`` restricts the rows to those contexts
    (a partition), and then nothing is compared with the receipt's printed figures, which cover every row."""
    rows = [r for r in rc.rows if selection is None or r.index in selection]
    if not rows:
        raise VerificationError(rc.path, "rows in the selection", "at least one", "none")
    n = sum(r.positions for r in rows)
    token_mean = math.fsum(r.mean_kld * r.positions for r in rows) / n
    top1 = math.fsum(r.top1 * r.positions for r in rows) / n
    cfg = rc.doc.get("bootstrap_config") or {}
    samples, seed = int(cfg.get("samples", 10_000)), int(cfg.get("seed", 1))
    boot = percentile_bootstrap([r.mean_kld for r in rows], [r.source_cluster for r in rows], samples, seed)
    out: dict[str, Any] = {
        "candidate": rc.candidate, "receipt": str(rc.path), "receipt_sha256": sha256_file(rc.path),
        "contexts": len(rows), "scored_positions": n, "source_clusters": boot["clusters"], "score_from": rc.score_from,
        "token_mean_kld": token_mean, "top1_agreement": top1, "context_macro_mean_kld": statistics.fmean(r.mean_kld for r in rows),
        "published_ci95": [boot["ci95_low"], boot["ci95_high"]], "published_interval": f"{PUBLISHED_INTERVAL} ({samples} samples, seed {seed})",
        "own_ci95": own_interval(rows, n_boot), "max_kld": rc.doc.get("max_kld") if selection is None else None,
        "matches_printed": selection is None,
    }
    if selection is None:
        d, pb = rc.doc, rc.doc["context_bootstrap"]
        _exact(rc.path, "token_mean_kld", d["token_mean_kld"], token_mean)
        _exact(rc.path, "top1_agreement", d["top1_agreement"], top1)
        _exact(rc.path, "context_macro_mean_kld", d["context_macro_mean_kld"], out["context_macro_mean_kld"])
        _exact(rc.path, "context_bootstrap.ci95_low", pb["ci95_low"], boot["ci95_low"])
        _exact(rc.path, "context_bootstrap.ci95_high", pb["ci95_high"], boot["ci95_high"])
        _exact(rc.path, "source_clusters", d["source_clusters"], boot["clusters"])
    return out


def check_inputs(path: Path, paired: Mapping[str, Any], receipts: Mapping[str, CumulativeReceipt]) -> None:
    """The paired receipt's inputs are these receipts: file digest, content digest, suite digest."""
    suite = paired.get("suite") or {}
    for label, ref in paired["inputs"].items():
        rc = receipts.get(label)
        if rc is None:
            raise VerificationError(path, f"inputs.{label}", "a cumulative receipt given for it", "none")
        if ref.get("sha256") != sha256_file(rc.path):
            raise VerificationError(path, f"inputs.{label}.sha256 (sha256 of {rc.path})", sha256_file(rc.path), ref.get("sha256"),
                                    "another file than the one this comparison was made from")
        if ref.get("content_sha256") != rc.doc.get("content_sha256"):
            raise VerificationError(path, f"inputs.{label}.content_sha256 ({rc.path}'s)", rc.doc.get("content_sha256"), ref.get("content_sha256"))
        parent = (rc.doc.get("suite") or {}).get("parent") or {}
        if suite.get("suite_token_sha256") not in (None, parent.get("suite_token_sha256")):
            raise VerificationError(path, f"suite.suite_token_sha256 ({rc.path}'s parent suite)", parent.get("suite_token_sha256"),
                                    suite.get("suite_token_sha256"))


def paired_figures(path: Path, key: str, comp: Mapping[str, Any], a: CumulativeReceipt, b: CumulativeReceipt,
                   margin: float | None, samples: int = 10_000, seed: int = 1, n_boot: int = DEFAULT_N_BOOT) -> dict[str, Any]:
    """One comparison ``a - b`` re-derived from the two receipts' rows and checked against ``comp`` (module docstring)."""
    ra, rb = {r.index: r for r in a.rows}, {r.index: r for r in b.rows}
    if set(ra) != set(rb):
        raise VerificationError(b.path, f"contexts (those of {a.path})", len(ra), f"{len(rb)}, differing at {sorted(set(ra) ^ set(rb))[:5]}")
    if a.score_from != b.score_from:
        raise VerificationError(b.path, f"scored_position_window.score_from ({a.path}'s)", a.score_from, b.score_from)
    shared = sorted(ra)
    for i in shared:
        if ra[i].source_cluster != rb[i].source_cluster or ra[i].positions != rb[i].positions:
            raise VerificationError(b.path, f"source_cluster, positions of context {i} ({a.path}'s)",
                                    (ra[i].source_cluster, ra[i].positions), (rb[i].source_cluster, rb[i].positions))
    diffs = [ra[i].mean_kld - rb[i].mean_kld for i in shared]
    boot = percentile_bootstrap(diffs, [ra[i].source_cluster for i in shared], samples, seed)
    rows = [ra[i] for i in shared]
    wins = (sum(d < 0 for d in diffs), sum(d > 0 for d in diffs), sum(d == 0 for d in diffs))
    derived = {"contexts": len(shared), "difference_a_minus_b": statistics.fmean(diffs), "ci95_low": boot["ci95_low"],
               "ci95_high": boot["ci95_high"], "a_wins": wins[0], "b_wins": wins[1], "ties": wins[2], "clusters": boot["clusters"]}
    for field, value in derived.items():
        if field in comp or field != "ties":
            _exact(path, f"comparisons.{key}.{field}", comp.get(field), value)
    counts, (sa, sb) = _cluster_arrays(rows, [np.array([ra[i].mean_kld * ra[i].positions for i in shared]),
                                              np.array([rb[i].mean_kld * rb[i].positions for i in shared])])
    W = draw_cluster_weights(counts.size, n_boot, DEFAULT_SEED)
    ci = ratio_intervals(W, sa - sb, counts)[0]
    n = counts.sum()
    return {"key": key, "a": a.candidate, "b": b.candidate, **derived, "published_ci95": [boot["ci95_low"], boot["ci95_high"]],
            "token_mean_difference": float(sa.sum() / n - sb.sum() / n), "own_ci95": ci, "margin": margin,
            "verdict": None if margin is None else {"A better": f"{a.candidate} better", "B better": f"{b.candidate} better"}.get(
                verdict(ci, margin), verdict(ci, margin)),
            "certifiable_margin": None if ci is None else max(-ci[0], ci[1])}
