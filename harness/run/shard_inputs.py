"""The one typed contract for scoring a shard: what a candidate x shard case reads, verified once.

A :class:`ShardInputs` is built by the pytest session (once per candidate x shard), by ``fidelity
replay`` (once per selected shard) and by the cross-engine floor (once per engine pair); scoring
(:func:`harness.run.shard.shard_positions`, :func:`harness.run.shard.score_shard`) and the
hand-over between pytest-xdist workers (:func:`harness.run.shared_scores.binding`) read only it.
:func:`verified` runs the joins of :mod:`harness.run.verify` before returning one, so every
``ShardInputs`` a run scores has passed them. A candidate scored while it is captured (``keep = "scores"``,
:mod:`harness.run.live_scores`) has no store: its :class:`LiveShardInputs` carry its :class:`LiveSide` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.capture.store import CaptureStore
from harness.inputs.head import HeadTensor
from harness.inputs.suite import Suite
from harness.io.jsonio import JSONObject
from harness.run.verify import verify_joins


@dataclass(frozen=True)
class ShardInputs:
    """The inputs of one candidate x shard (frozen: built once, shared by every use of the case)."""

    #: The verified suite the stores were captured on.
    suite: Suite
    #: The shard's index in the suite.
    shard: int
    #: The reference's capture store (hidden states or logits).
    reference: CaptureStore
    #: The candidate's capture store, holding every context of the shard.
    candidate: CaptureStore
    #: The shared BF16 LM head (None only when both stores hold logits).
    head: HeadTensor | None
    #: The candidate's own head (head attribution), or None for the shared head.
    cand_head: HeadTensor | None = None
    #: The scoring window: rows ``< score_from`` of every context are dropped before any statistic.
    score_from: int = 0

    @property
    def indices(self) -> list[int]:
        """The suite context indices of the shard, in order."""
        return list(self.suite.shard_indices(self.shard))


def verified(inputs: ShardInputs) -> ShardInputs:
    """``inputs`` after every join check (:func:`harness.run.verify.verify_joins`) has passed."""
    verify_joins(suite=inputs.suite, reference=inputs.reference, candidate=inputs.candidate, head=inputs.head,
                 cand_head=inputs.cand_head, score_from=inputs.score_from, shards=[inputs.shard])
    return inputs


@dataclass(frozen=True)
class LiveSide:
    """A candidate scored while it is captured: what a store's manifest would say of it, with no store."""

    #: The captured model's identity by content (a store's ``model``).
    identity: JSONObject
    #: The header a store of this capture would carry: ``engine``, ``runtime``, ``device``, ``kind``, ``dtype``
    #: and ``hidden_size`` (recorded in the report's comparability block as a store's are).
    manifest: JSONObject = field(hash=False)
    #: The folder its scores are kept in while the shard is scored (named in errors).
    root: Path


@dataclass(frozen=True)
class LiveShardInputs:
    """The inputs of one ``keep = "scores"`` candidate x shard: a :class:`ShardInputs` without a candidate store."""

    suite: Suite
    shard: int
    reference: CaptureStore
    candidate: LiveSide
    head: HeadTensor | None
    cand_head: HeadTensor | None = None
    score_from: int = 0

    @property
    def indices(self) -> list[int]:
        """The suite context indices of the shard, in order."""
        return list(self.suite.shard_indices(self.shard))
