"""Group effects with paired cluster-bootstrap intervals (numpy only): the shard reports' studentized
source-cluster interval (:data:`INTERVAL_METHOD_TEXT`), with common random numbers.

Every variant is scored on the same positions as the candidate, so each effect is a difference of
two token means over the same positions and its interval applies the *same* cluster draws to both
(common random numbers, :mod:`harness.metrics.bootstrap`): per source cluster ``c`` the effect's
numerator is a sum ``d_c`` and the positions ``n_c`` are shared, so the effect is the ratio mean
``sum d_c / sum n_c`` of the bootstrap's own ratio machinery.

Reasoning: docs/diagnostics.md §"Group effects and their intervals".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from harness.metrics.bootstrap import (
    DEFAULT_N_BOOT,
    DEFAULT_SEED,
    DIFF_METHOD_TEXT,
    MEAN_METHOD,
    MEAN_METHOD_TEXT,
    draw_cluster_weights,
    ratio_intervals,
)

MIB = 2**20
#: The intervals' method: the shard reports' studentized source-cluster bootstrap (``bootstrap.method``).
INTERVAL_METHOD = MEAN_METHOD
#: The same in words (a KLD's and a difference's rule), with the pairing: every variant's interval applies the same
#: cluster draws.
INTERVAL_METHOD_TEXT = (f"a KLD: {MEAN_METHOD_TEXT}; a difference (effect, interaction): {DIFF_METHOD_TEXT}; common random "
                        "numbers (the same cluster draws for every variant)")


class Estimate(TypedDict):
    """A token mean (or a difference of two over the same positions) with its 95% interval."""

    #: nats
    value: float
    #: the studentized cluster interval; None below the bootstrap's minimum of clusters
    ci95: list[float] | None


class TestedEstimate(Estimate):
    """An :class:`Estimate` with whether its interval lies off zero."""

    #: the interval lies wholly above or wholly below zero (False when there is no interval)
    excludes_zero: bool


def tested(e: Estimate) -> TestedEstimate:
    """``e`` with ``excludes_zero`` (:class:`TestedEstimate`)."""
    ci = e["ci95"]
    return {"value": e["value"], "ci95": ci, "excludes_zero": ci is not None and (ci[0] > 0 or ci[1] < 0)}


@dataclass(frozen=True)
class GroupData:
    """One group's inputs: parameters, bytes, and the per-context KLD sums of its variants."""

    name: str
    params: tuple[str, ...]
    bytes: int
    reference_bytes: int
    restore_sum_kld: np.ndarray  # per context: KLD sums of the candidate with this group restored
    only_sum_kld: np.ndarray | None  # per context: KLD sums of the reference with only this group quantized


def cluster_ids(clusters: Sequence[str]) -> tuple[np.ndarray, int]:
    """Dense cluster id per context and the number of clusters."""
    names: dict[str, int] = {}
    ids = np.array([names.setdefault(c, len(names)) for c in clusters], dtype=np.int64)
    return ids, len(names)


class PairedMeans:
    """Token means of per-context sums over the same positions, with common-random-number intervals."""

    def __init__(self, clusters: Sequence[str], positions: np.ndarray, n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED) -> None:
        self.ids, self.n_clusters = cluster_ids(clusters)
        self.positions = np.asarray(positions, dtype=np.float64)
        self.n_positions = float(self.positions.sum())
        self.cluster_positions = np.bincount(self.ids, weights=self.positions, minlength=self.n_clusters)
        self.weights = draw_cluster_weights(self.n_clusters, n_boot, seed)
        self.n_boot, self.seed = n_boot, seed

    def estimate(self, per_context: np.ndarray, *, nonnegative: bool = False) -> Estimate:
        """``{"value", "ci95"}`` of ``sum(per_context) / positions`` (a difference when the sums are differences):
        the studentized cluster interval of the shard reports (:func:`harness.metrics.bootstrap.ratio_intervals`),
        clipped at 0 for a KLD (``nonnegative``); ``ci95`` None below the bootstrap's minimum of clusters."""
        sums = np.bincount(self.ids, weights=np.asarray(per_context, dtype=np.float64), minlength=self.n_clusters)
        bounds = (0.0, math.inf) if nonnegative else (-math.inf, math.inf)
        (ci,) = ratio_intervals(self.weights, sums[:, None], self.cluster_positions, bounds=bounds)
        return {"value": float(sums.sum() / self.n_positions), "ci95": ci}


def grouping_effects(pm: PairedMeans, candidate_sum_kld: np.ndarray, rule: str, partition: bool,
                     groups: Sequence[GroupData], candidate_bytes: int) -> dict[str, Any]:
    """Effects, ranking, additivity and bits-to-spend of one grouping (see docs/diagnostics.md §"Group effects and their intervals")."""
    cand = np.asarray(candidate_sum_kld, dtype=np.float64)
    whole = pm.estimate(cand, nonnegative=True)
    rows = []
    for g in groups:
        restore = pm.estimate(cand - g.restore_sum_kld)
        row: dict[str, Any] = {
            "group": g.name,
            "n_params": len(g.params),
            "params": list(g.params),
            "bytes": int(g.bytes),
            "byte_share": g.bytes / candidate_bytes if candidate_bytes else None,
            "restore_cost_bytes": int(g.reference_bytes - g.bytes),
            "restore": tested(restore),
            "restore_share_of_whole": restore["value"] / whole["value"] if whole["value"] else None,
            "restore_per_mib": restore["value"] / (g.bytes / MIB) if g.bytes else None,
        }
        if g.only_sum_kld is not None:
            only = pm.estimate(g.only_sum_kld, nonnegative=True)
            row["only"] = tested(only)
        rows.append(row)
    rows.sort(key=lambda r: (-r["restore"]["value"], r["group"]))
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    out: dict[str, Any] = {"rule": rule, "partition": partition, "groups": rows}
    if partition:
        restored_all = sum((np.asarray(g.restore_sum_kld, dtype=np.float64) for g in groups), np.zeros_like(cand))
        k = len(groups)
        # whole - sum_g (cand - restore_g) = restore-sum - (k - 1) * cand, per context
        inter = pm.estimate(restored_all - (k - 1) * cand)
        sum_restore = pm.estimate(k * cand - restored_all)
        add: dict[str, Any] = {
            "sum_restore": sum_restore,
            "interaction_restore": tested(inter),
            "explained_restore": sum_restore["value"] / whole["value"] if whole["value"] else None,
        }
        if all(g.only_sum_kld is not None for g in groups):
            only_all = sum((np.asarray(g.only_sum_kld, dtype=np.float64) for g in groups), np.zeros_like(cand))
            inter_o = pm.estimate(cand - only_all)
            add["sum_only"] = pm.estimate(only_all)
            add["interaction_only"] = tested(inter_o)
            add["explained_only"] = add["sum_only"]["value"] / whole["value"] if whole["value"] else None
        out["additivity"] = add
    else:
        out["additivity"] = None
    spend = [r for r in rows if r["restore"]["ci95"] is not None and r["restore"]["ci95"][0] > 0 and r["restore_per_mib"] is not None]
    spend.sort(key=lambda r: (-r["restore_per_mib"], r["group"]))
    out["bits_to_spend"] = [
        {"group": r["group"], "restore_per_mib": r["restore_per_mib"], "restore": r["restore"]["value"],
         "restore_cost_bytes": r["restore_cost_bytes"]}
        for r in spend
    ]
    return out
