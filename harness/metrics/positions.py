"""Position bookkeeping shared by the summary and paired modules: labels, the scoring window, cluster ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from harness.metrics.scores import PositionScores


@dataclass(frozen=True)
class ContextLabel:
    """Per-context labels from the suite: ``index`` (the suite's context index), ``source_cluster``, ``stratum``."""

    index: int
    source_cluster: Any
    stratum: str


@dataclass
class Layout:
    """Positions after the window, mapped to dense context and cluster ids."""

    scores: PositionScores
    ctx: np.ndarray  # dense context id per position (into ``contexts``)
    cluster: np.ndarray  # dense cluster id per position
    contexts: list[ContextLabel]
    ctx_cluster: np.ndarray  # dense cluster id per context
    cluster_names: list[Any]
    score_from: int

    @property
    def n_clusters(self) -> int:
        return len(self.cluster_names)


class ScoredPositions(Protocol):
    """Scored positions of one shard as the report layer reads them (:class:`harness.run.shard.ShardPositions`)."""

    @property
    def scores(self) -> PositionScores:
        """Every scored position's statistics."""
        ...

    @property
    def context_index(self) -> np.ndarray:
        """Each position's context (suite index)."""
        ...

    @property
    def row(self) -> np.ndarray:
        """Each position's row within its context."""
        ...

    @property
    def labels(self) -> Sequence[ContextLabel]:
        """One label per context of the shard."""
        ...


def layout(
    scores: PositionScores,
    context_index: np.ndarray,
    row: np.ndarray,
    contexts: Sequence[ContextLabel],
    score_from: int,
) -> Layout:
    """Apply the window (``row >= score_from``, before any statistic) and map labels to dense ids.

    Every listed context must keep at least one position; every position's context must be listed.
    """
    n = len(scores)
    context_index = np.asarray(context_index, dtype=np.int64)
    row = np.asarray(row, dtype=np.int64)
    if context_index.shape != (n,) or row.shape != (n,):
        raise ValueError(f"context_index/row: expected shape ({n},), found {context_index.shape} and {row.shape}")
    if score_from < 0:
        raise ValueError(f"score_from: expected >= 0, found {score_from}")
    keep = row >= score_from
    sc = scores.select(keep) if not keep.all() else scores
    ci = context_index[keep]
    ctxs = list(contexts)
    pos_of = {c.index: i for i, c in enumerate(ctxs)}
    if len(pos_of) != len(ctxs):
        raise ValueError("contexts: duplicate context index")
    order = np.array([c.index for c in ctxs], dtype=np.int64)
    sorter = np.argsort(order)
    loc = np.searchsorted(order, ci, sorter=sorter)
    loc = np.minimum(loc, len(order) - 1)
    dense = sorter[loc]
    if ci.size and not np.array_equal(order[dense], ci):
        bad = sorted(set(ci.tolist()) - set(order.tolist()))[:5]
        raise ValueError(f"context_index: positions of contexts not in the label list: {bad}")
    counts = np.bincount(dense, minlength=len(ctxs))
    if (counts == 0).any():
        missing = [ctxs[i].index for i in np.flatnonzero(counts == 0)[:5]]
        raise ValueError(f"contexts without positions after score_from={score_from}: {missing}")
    names: dict[Any, int] = {}
    ctx_cluster = np.array([names.setdefault(c.source_cluster, len(names)) for c in ctxs], dtype=np.int64)
    return Layout(sc, dense, ctx_cluster[dense], ctxs, ctx_cluster, list(names), score_from)
