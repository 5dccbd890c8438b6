"""Scored positions shared by the pytest-xdist workers of one session: each candidate x shard is
scored once per *session*, not once per worker.

A shard case scores its positions; the tail, window and paired cases of the same run need those
positions again, for every candidate. In one process :class:`~harness.run.session.FidelitySession`
keeps them in memory. Under ``-n W`` the cases are spread over W processes, and a window case on
one worker would otherwise re-score every candidate the other worker already scored -- more total
work than a serial run, so scale-out would lose.

The workers of one session therefore share a folder (``<cache_dir>/scored/<testrunuid>/``, the id
pytest-xdist gives the session; the controller removes it when the session ends). The first worker
to need ``(candidate, shard)`` takes an exclusive lock on ``<name>-shardNN.lock``, scores, and writes
``<name>-shardNN.npz`` atomically; a worker that needs the same positions meanwhile waits on the lock
and then reads the file. Nothing else reads these files and nothing survives the session: they are a
hand-over between the processes of one run, never a cache of scores across runs. Arrays are read
with ``allow_pickle=False`` and their lengths are checked against each other.
"""

from __future__ import annotations

import fcntl
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.errors import FidelityError
from harness.io.atomic import atomic_write_bytes

if TYPE_CHECKING:
    from harness.run.shard import ShardPositions

__all__ = ["load_positions", "save_positions", "scored_once", "shared_dir"]

#: PositionScores fields, in the order written (each an array of one entry per position)
_SCORE_FIELDS = ("kld", "jsd_bits", "ear", "nll_ref", "nll_cand", "argmax_ref", "argmax_cand")
_SCHEMA = "fidelity.shared-positions/1"


def shared_dir(cache_dir: Path, testrunuid: str) -> Path:
    """The folder the workers of session ``testrunuid`` share."""
    if not testrunuid.isalnum():
        raise FidelityError(f"pytest-xdist testrunuid: expected an alphanumeric id, found {testrunuid!r}")
    return Path(cache_dir) / "scored" / testrunuid


def save_positions(path: Path, pos: ShardPositions) -> None:
    """Write ``pos`` to ``path`` (.npz) atomically: arrays as arrays, the rest as one JSON string."""
    meta = {
        "schema": _SCHEMA,
        "labels": [[lab.index, lab.source_cluster, lab.stratum] for lab in pos.labels],
        "mode": pos.mode, "head_sha256": pos.head_sha256, "cand_head_sha256": pos.cand_head_sha256,
        "load_s": pos.load_s, "score_s": pos.score_s, "scorer_run": pos.scorer_run,
    }
    arrays = {f: getattr(pos.scores, f) for f in _SCORE_FIELDS}
    buf = io.BytesIO()
    np.savez(buf, context_index=pos.context_index, row=pos.row, meta=np.array(json.dumps(meta)), **arrays)
    atomic_write_bytes(path, buf.getvalue())


def load_positions(path: Path) -> ShardPositions:
    """Read what :func:`save_positions` wrote; a file of another shape is a FidelityError naming it."""
    from harness.metrics import ContextLabel
    from harness.run.shard import ShardPositions
    from harness.scoring.scores import PositionScores

    with np.load(path, allow_pickle=False) as z:
        missing = sorted({"meta", "context_index", "row", *_SCORE_FIELDS} - set(z.files))
        if missing:
            raise FidelityError(f"{path}: shared positions: expected arrays {', '.join(missing)}, found none")
        meta = json.loads(str(z["meta"]))
        arrays = {f: z[f] for f in _SCORE_FIELDS}
        context_index, row = z["context_index"], z["row"]
    if meta.get("schema") != _SCHEMA:
        raise FidelityError(f"{path}: shared positions schema: expected {_SCHEMA}, found {meta.get('schema')!r}")
    lengths = {k: len(v) for k, v in {**arrays, "context_index": context_index, "row": row}.items()}
    if len(set(lengths.values())) != 1:
        raise FidelityError(f"{path}: shared positions: expected arrays of one length, found {lengths}")
    return ShardPositions(
        scores=PositionScores(**arrays),
        context_index=context_index, row=row,
        labels=[ContextLabel(int(i), c, str(s)) for i, c, s in meta["labels"]],
        mode=str(meta["mode"]), head_sha256=meta["head_sha256"], cand_head_sha256=meta["cand_head_sha256"],
        load_s=float(meta["load_s"]), score_s=float(meta["score_s"]), scorer_run=dict(meta["scorer_run"]),
    )


def scored_once(folder: Path, name: str, shard: int, score: Callable[[], ShardPositions]) -> ShardPositions:
    """The positions of ``name`` x ``shard``: read from ``folder`` when a worker of this session
    already scored them, else scored here (under the lock, so no two workers score the same shard)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}-shard{shard:02d}.npz"
    with open(folder / f"{name}-shard{shard:02d}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if target.is_file():
                return load_positions(target)
            pos = score()
            save_positions(target, pos)
            return pos
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
