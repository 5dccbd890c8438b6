"""A shard's scored positions as bytes, for the trip from a cluster task back to its driver.

The bytes are an ``.npz`` (no pickle): one array per :class:`~harness.metrics.scores.PositionScores`
field, ``context_index`` and ``row``, and ``meta`` (one JSON string: schema, context labels, mode, head
hashes, timings, scorer run). Reading checks the schema, that every array is there with one length, and
that every KLD is finite (as the scorer checks its own); a mismatch is a FidelityError naming the source.
"""

from __future__ import annotations

import io
import json
from dataclasses import fields
from typing import TYPE_CHECKING

import numpy as np

from harness.errors import FidelityError
from harness.metrics import ContextLabel
from harness.metrics.scores import PositionScores

if TYPE_CHECKING:
    from harness.run.shard import ShardPositions

__all__ = ["positions_from_bytes", "positions_to_bytes"]

_SCHEMA = "fidelity.task-positions/1"


def _score_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(PositionScores))


def positions_to_bytes(pos: ShardPositions) -> bytes:
    """``pos`` as the bytes of an ``.npz``."""
    meta = {
        "schema": _SCHEMA,
        "labels": [[lab.index, lab.source_cluster, lab.stratum] for lab in pos.labels],
        "mode": pos.mode, "head_sha256": pos.head_sha256, "cand_head_sha256": pos.cand_head_sha256,
        "load_s": pos.load_s, "score_s": pos.score_s, "scorer_run": pos.scorer_run,
    }
    buf = io.BytesIO()
    np.savez(buf, context_index=pos.context_index, row=pos.row, meta=np.array(json.dumps(meta)),
             **{f: getattr(pos.scores, f) for f in _score_fields()})
    return buf.getvalue()


def positions_from_bytes(data: bytes, where: str) -> ShardPositions:
    """Read what :func:`positions_to_bytes` produced; ``where`` names the source in errors."""
    from harness.run.shard import ShardPositions

    names = _score_fields()
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            missing = sorted({"meta", "context_index", "row", *names} - set(z.files))
            if missing:
                raise FidelityError(f"{where}: positions: expected arrays {', '.join(missing)}, found none")
            meta = json.loads(str(z["meta"]))
            arrays = {f: z[f] for f in names}
            context_index, row = z["context_index"], z["row"]
    except (OSError, ValueError) as exc:
        raise FidelityError(f"{where}: positions: expected an .npz without pickled objects, found: {exc}") from None
    if not isinstance(meta, dict) or meta.get("schema") != _SCHEMA:
        raise FidelityError(f"{where}: positions schema: expected {_SCHEMA}, found "
                            f"{meta.get('schema') if isinstance(meta, dict) else type(meta).__name__!r}")
    lengths = {k: len(v) for k, v in {**arrays, "context_index": context_index, "row": row}.items()}
    if len(set(lengths.values())) != 1:
        raise FidelityError(f"{where}: positions: expected arrays of one length, found {lengths}")
    if not np.isfinite(arrays["kld"]).all():  # the check the scorer's own output passes (check_scores_finite)
        raise FidelityError(f"{where}: positions: expected finite kld, found NaN or Inf")
    return ShardPositions(
        scores=PositionScores(**arrays),
        context_index=context_index, row=row,
        labels=[ContextLabel(int(i), c, str(s)) for i, c, s in meta["labels"]],
        mode=str(meta["mode"]), head_sha256=meta["head_sha256"], cand_head_sha256=meta["cand_head_sha256"],
        load_s=float(meta["load_s"]), score_s=float(meta["score_s"]), scorer_run=dict(meta["scorer_run"]),
    )
