"""How a hidden-state shard is cut for scoring: whole, or in chunks of contexts when its captures are large.

:func:`streams` decides; :func:`chunk_indices` cuts; :func:`score_groups` gives the groups of contexts the
store-then-score path scores one call each (:func:`harness.run.shard.shard_positions`, streamed by
:mod:`harness.scoring.streaming`), which the scorer of a capture in memory cuts the same way
(:func:`harness.scoring.torch_path.shard_tiles`). No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CHUNK_BYTES", "STREAM_MIN_BYTES", "chunk_indices", "score_groups", "streams"]

#: Shards whose two captures together exceed this are streamed by ``shard_positions``.
STREAM_MIN_BYTES = 256 * 1024 * 1024
#: Target bytes per chunk and store (bf16 hidden states): ~12 contexts of 511 rows at hidden 5120.
CHUNK_BYTES = 64 * 1024 * 1024


def streams(n_contexts: int, rows_per_context: int, width: int) -> bool:
    """Whether :func:`harness.run.shard.shard_positions` streams a shard of ``n_contexts`` bf16 hidden-state
    contexts (both captures together above :data:`STREAM_MIN_BYTES`) instead of scoring it in one call."""
    return 2 * n_contexts * rows_per_context * width * 2 > STREAM_MIN_BYTES


def score_groups(indices: Sequence[int], rows_per_context: int, width: int, head_itemsize: int) -> list[list[int]]:
    """The groups of contexts a hidden-state shard is scored in, one :func:`harness.scoring.scorer.score_hidden`
    call each: the whole shard, or :func:`chunk_indices`' chunks when it :func:`streams`."""
    if streams(len(indices), rows_per_context, width):
        return chunk_indices(indices, rows_per_context, width * head_itemsize)
    return [list(indices)]


def chunk_indices(indices: Sequence[int], rows_per_context: int, row_bytes: int, chunk_bytes: int | None = None) -> list[list[int]]:
    """Split context ``indices`` into consecutive chunks of about ``chunk_bytes`` (None: :data:`CHUNK_BYTES`) per
    store (>= 1 context)."""
    per = max(1, (chunk_bytes or CHUNK_BYTES) // max(1, rows_per_context * row_bytes))
    idx = list(indices)
    return [idx[i : i + per] for i in range(0, len(idx), per)]
