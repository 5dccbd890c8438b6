"""A shard report's ``metrics`` block from its scored positions: the statistics under a window, with the
difference the run resolves. Called by :func:`harness.run.shard.score_shard` and, through the summaries cache
(:mod:`harness.run.summary_cache`), by the pytest session."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from harness.metrics import ContextLabel, summarize
from harness.metrics.bootstrap import DEFAULT_SEED
from harness.metrics.records import ShardSummary
from harness.metrics.scores import PositionScores
from harness.planning.design import single_run_resolvable_delta


class ScoredPositions(Protocol):
    """What a summary reads of scored positions (:class:`harness.run.shard.ShardPositions`)."""

    scores: PositionScores
    context_index: np.ndarray
    row: np.ndarray
    labels: list[ContextLabel]


def shard_metrics(pos: ScoredPositions, *, score_from: int, n_boot: int, seed: int = DEFAULT_SEED) -> ShardSummary:
    """A report's ``metrics`` block: the statistics of scored positions under the window ``score_from``
    (bootstrap of ``n_boot`` replicates drawn from ``seed``), with the difference it resolves."""
    metrics = summarize(pos.scores, pos.context_index, pos.row, pos.labels, score_from=score_from, n_boot=n_boot, seed=seed)
    # the smallest difference in mean KLD this run resolves (95% confidence, 80% power; see harness.planning)
    metrics["resolvable_delta"] = single_run_resolvable_delta(metrics["contexts"])
    return metrics
