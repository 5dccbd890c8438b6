"""One candidate x shard as a task on a cluster node: capture it if needed, score it, hand back its data.

This is the body a Ray worker runs (:mod:`harness.run.cluster.ray_executor` submits it); it imports no Ray, so
it is plain Python that any process can call. The task **returns** what it measured and writes no
report: the driver verifies the result and writes every report itself, exactly as a serial run does.
The only files a task writes are in the configuration's ``cache_dir``: capture stores (a live
candidate's shard, through the resumable :class:`~harness.capture.store.StoreWriter`, while holding
the store's task lock: :func:`_live_store`), or for a candidate with ``keep = "scores"`` its scored tiles and
entry (:mod:`harness.run.live_scores`, under the entry's lock), so a task killed at any instant and run again (Ray's retry)
resumes the capture and scores from scratch: nothing half-written is ever read, and nothing is counted twice.

Reasoning: docs/ray.md §"A task's result".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

from harness.capture.loop import capture
from harness.capture.store import CaptureStore
from harness.engines.base import EngineOptions
from harness.engines.registry import get_engine, require
from harness.errors import FidelityError, VerificationError
from harness.inputs.config import load_config
from harness.io.hashing import sha256_file
from harness.run.cluster.positions_wire import positions_to_bytes

if TYPE_CHECKING:
    from harness.inputs.config import CandidateConfig, FidelityConfig
    from harness.run.session import FidelitySession

__all__ = ["RESULT_SCHEMA", "TaskSpec", "capture_reference", "result_digest", "run_case"]

RESULT_SCHEMA = "fidelity.cluster-result/1"


@dataclass(frozen=True)
class TaskSpec:
    """What one task is told (plain values, so it travels to any node)."""

    #: Absolute path of the ``fidelity.toml`` (the same path on every node).
    config: str
    #: sha256 of the file's bytes as the driver read it: a node that sees another file refuses.
    config_sha256: str
    #: ``--fidelity-device``: ``auto`` resolves on the worker (the GPU Ray assigned it, else the CPU).
    device: str
    #: ``--fidelity-window``.
    score_from: int
    #: The driver's capture cache key (:mod:`harness.capture.cache_sign`), carried in memory in the task payload
    #: (never written to a file), so a worker on another machine signs and checks the cache as the driver does;
    #: empty: the worker reads this user's key file.
    cache_key: bytes = field(default=b"", repr=False)
    #: The driver's ``score_cache`` (``[settings]``, or off by ``--fidelity-no-score-cache``): the task reads and
    #: keeps scored positions and summaries only when it is on.
    score_cache: bool = True


def result_digest(report_text: str, positions: bytes) -> str:
    """The ``sha256`` a result carries: report text (UTF-8) then positions bytes."""
    h = hashlib.sha256(report_text.encode("utf-8"))
    h.update(positions)
    return h.hexdigest()


def _node() -> str:
    return f"{socket.gethostname()} pid {os.getpid()}"


#: Sessions of this worker process, by task spec: suite, head and reference load once per worker.
_SESSIONS: dict[TaskSpec, FidelitySession] = {}


def _session(spec: TaskSpec) -> FidelitySession:
    if spec not in _SESSIONS:
        from harness.run.session import FidelitySession, resolve_device

        path = Path(spec.config)
        if not path.is_file():
            raise FidelityError(f"{path}: not found on node {socket.gethostname()}: every node must reach the "
                                "configuration and its files at the same path (a shared file system)")
        found = sha256_file(path)
        if found != spec.config_sha256:
            raise FidelityError(f"{path}: on node {socket.gethostname()}: expected the driver's file (sha256 "
                                f"{spec.config_sha256}), found sha256 {found}: every node must read the same file")
        config = dataclasses.replace(load_config(path), score_cache=spec.score_cache)
        _check_reachable(config)
        _SESSIONS[spec] = FidelitySession(config=config, device=resolve_device(spec.device), score_from=spec.score_from,
                                          cache_key=spec.cache_key or None)
    return _SESSIONS[spec]


def _check_reachable(config: FidelityConfig) -> None:
    """Every input path of the configuration exists on this node (else: which one, and why it must)."""
    ref = config.reference
    paths = [config.suite, ref.head, *([ref.model] if ref.model is not None else [])]
    if ref.model is None:
        paths.append(ref.store)
    for path in paths:
        if not path.exists():
            raise FidelityError(f"{path}: not found on node {socket.gethostname()}: every node must reach the "
                                "configuration's suite, head, stores and models at the same path (a shared file system)")


def _check_candidate(config: FidelityConfig, name: str) -> None:
    cand = config.candidate(name)
    for path in (p for p in (cand.model, cand.store, cand.head) if p is not None):
        if not path.exists():
            raise FidelityError(f"{path}: candidate {name}: not found on node {socket.gethostname()}: every node must "
                                "reach the candidate's model or store at the same path (a shared file system)")


def _live_store(session: FidelitySession, cand: CandidateConfig, shard: int) -> CaptureStore:
    """The live candidate's capture store holding ``shard``, captured here when it does not yet.

    The tasks of one candidate share one store (as a serial run's shards do). A task checks, captures and
    opens it holding an exclusive lock (``.<store>.task-lock`` beside it), so no task reads the store while
    another writes it, and a task killed mid-write leaves only what the next writer removes on open (an
    unlisted context file of an interrupted write): the store then fails verification once, is handed to
    the writer, which removes that leftover (and refuses anything it did not write), and is opened again."""
    assert cand.model is not None
    require(get_engine(cand.engine, str(session.config.path)))
    out = session.live_store_path(cand)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(out.parent / f".{out.name}.task-lock"):
        try:  # believed only when this user's harness signed it (else: recaptured, with a warning)
            store = session.cached_store(cand, out)
        except VerificationError:
            store = None
        if store is None or store.missing(session.shard_indices(shard)):
            store = capture(cand.engine, cand.model, session.suite, out, shards=[shard],
                            options=EngineOptions(device=session.device, engine_options=cand.options), progress=False,
                            identity=session.candidate_identity(cand), cache_key=session.signing_key())
    return store


def capture_reference(spec: TaskSpec) -> dict[str, object]:
    """Capture the reference store when it is missing (once, before the candidates' tasks), verify it."""
    try:
        _ = _session(spec).reference
    except FidelityError as exc:
        return {"schema": RESULT_SCHEMA, "error": f"reference: {exc}", "node": _node()}
    return {"schema": RESULT_SCHEMA, "node": _node()}


def run_case(spec: TaskSpec, name: str, shard: int, ready: Mapping[str, object] | None = None) -> dict[str, object]:
    """Capture (when needed) and score ``name`` x ``shard``; return its report and positions.

    ``ready``: the reference-capture task's result when the reference had to be captured first (Ray
    passes it once that task has finished); its error becomes this case's error."""
    if ready is not None and "error" in ready:
        return {"schema": RESULT_SCHEMA, "error": str(ready["error"]), "node": str(ready.get("node"))}
    t0 = time.perf_counter()
    try:
        session = _session(spec)
        _check_candidate(session.config, name)
        cand = session.config.candidate(name)
        if cand.model is not None and cand.keep == "store":  # keep = "scores": scored while captured, no store
            session.hold_store(name, _live_store(session, cand, shard))
        scored = session.score(cand, shard)
        positions = session.positions(cand, shard)
    except FidelityError as exc:
        return {"schema": RESULT_SCHEMA, "error": str(exc), "node": _node()}
    session.forget(name, shard)  # the driver keeps the positions; a worker holds none between tasks
    # facts of this run (never compared): the whole task's wall time (capture included) and where it ran
    scored.report.timing["task_s"] = time.perf_counter() - t0
    scored.report.timing["node"] = socket.gethostname()
    report_text = json.dumps(scored.report.to_json_dict(), sort_keys=True)
    data = positions_to_bytes(positions)
    return {"schema": RESULT_SCHEMA, "report": report_text, "positions": data,
            "sha256": result_digest(report_text, data), "node": _node()}
