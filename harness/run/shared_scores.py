"""Scored positions shared by the pytest-xdist workers of one session: each candidate x shard is
scored once per *session*, not once per worker.

A shard case scores its positions; the tail, window and paired cases of the same run need those
positions again, for every candidate. In one process :class:`~harness.run.session.FidelitySession`
keeps them in memory. Under ``-n W`` the cases are spread over W processes, and a window case on
one worker would otherwise re-score every candidate the other worker already scored -- more total
work than a serial run, so scale-out would lose.

Reasoning: docs/performance.md §"Scores shared by the xdist workers".
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np
from filelock import FileLock

from harness.errors import FidelityError, VerificationError
from harness.io.atomic import atomic_write_bytes
from harness.io.jsonio import JSONObject, loads_json
from harness.io.owned import remove_empty_folder
from harness.io.schema import Closed, MapOf, Nullable, check
from harness.metrics import ContextLabel
from harness.metrics.scores import PositionScores
from harness.scoring.backends import scoring_env

if TYPE_CHECKING:
    from harness.capture.store import CaptureStore
    from harness.inputs.head import HeadTensor
    from harness.inputs.suite import Suite
    from harness.run.shard import ShardPositions

__all__ = ["Handover", "binding", "load_positions", "load_positions_with", "remove_session_files", "save_positions", "scored_once",
           "shared_dir", "store_content_sha256"]

#: PositionScores fields, in the order written (each an array of one entry per position)
_SCORE_FIELDS = ("kld", "jsd_bits", "ear", "nll_ref", "nll_cand", "argmax_ref", "argmax_cand",
                 "kld_rev", "entropy_ref", "p_ref_top", "q_ref_top", "top5_overlap", "top10_overlap")
_ARRAYS = (*_SCORE_FIELDS, "context_index", "row")
_SCHEMA = "fidelity.shared-positions/3"
#: The names a session writes in its folder (a candidate's name, then the shard).
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+]*-shard\d{2,}\.(npz|lock)$")
#: A hand-over file staged by :func:`harness.io.atomic.atomic_write_bytes` (left by a killed worker).
_STAGED = re.compile(r"^\.[A-Za-z0-9][A-Za-z0-9_.+]*-shard\d{2,}\.npz\.[A-Za-z0-9_]+\.tmp$")


@dataclass(frozen=True)
class Handover:
    """The hand-over of one pytest-xdist session: its folder, its id and its secret ``key`` (drawn by the
    controller, given to the workers in memory; it signs every hand-over file)."""

    folder: Path
    session: str
    key: bytes


def shared_dir(cache_dir: Path, testrunuid: str) -> Path:
    """The folder the workers of session ``testrunuid`` share."""
    if not testrunuid.isalnum():
        raise FidelityError(f"pytest-xdist testrunuid: expected an alphanumeric id, found {testrunuid!r}")
    return Path(cache_dir) / "scored" / testrunuid


def store_content_sha256(store: CaptureStore, indices: list[int]) -> str:
    """sha256 naming the content of ``indices`` in a capture store: its kind, dtype, width and the sha256
    of each context file (every file is verified against these when it is loaded)."""
    doc = {"kind": store.kind, "dtype": store.dtype, "width": store.width,
           "files": [[i, store.hashes.get(i)] for i in indices]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode("utf-8")).hexdigest()


def binding(*, session: str | None, candidate: str, suite: Suite, shard: int, reference: CaptureStore, cand_store: CaptureStore,
            head: HeadTensor | None, cand_head: HeadTensor | None, window: int, device: str) -> JSONObject:
    """Everything the positions of ``candidate`` x ``shard`` were computed from (docs/performance.md §"Scores shared by the xdist workers");
    ``session`` None: bound to no session (the scores cache across runs, :mod:`harness.run.score_cache`)."""
    from harness.run.shard import SCORER_SETTINGS

    indices = list(suite.shard_indices(shard))
    scorer: JSONObject = {**SCORER_SETTINGS, "device": device, "env": dict(scoring_env())}
    bound: JSONObject = {} if session is None else {"session": session}
    return {
        **bound, "candidate": candidate, "candidate_identity": cand_store.identity,
        "candidate_store_sha256": store_content_sha256(cand_store, indices),
        "reference_identity": reference.identity, "reference_store_sha256": store_content_sha256(reference, indices),
        "suite_token_sha256": suite.suite_token_sha256, "shard": shard, "shard_sha256": suite.shard(shard).sha256,
        "window": window, "scorer": scorer,
        "head_sha256": getattr(head, "sha256", None), "cand_head_sha256": getattr(cand_head, "sha256", None),
    }


def _signature(key: bytes, meta: str, arrays: dict[str, np.ndarray], domain: bytes) -> str:
    mac = hmac.new(key, domain + meta.encode("utf-8"), hashlib.sha256)
    for name in _ARRAYS:
        a = np.ascontiguousarray(arrays[name])
        mac.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        mac.update(a.tobytes())
    return mac.hexdigest()


def save_positions(path: Path, pos: ShardPositions, bound: JSONObject, key: bytes, *, domain: bytes = b"") -> None:
    """Write ``pos`` to ``path`` (.npz) atomically: arrays as arrays, the rest (with ``bound``, what they
    were computed from) as one JSON string, and the signature over both (``domain``: a prefix of the signed
    text naming the protocol, so a file of one protocol is never believed by another)."""
    meta = json.dumps({
        "schema": _SCHEMA, "binding": bound,
        "labels": [[lab.index, lab.source_cluster, lab.stratum] for lab in pos.labels],
        "mode": pos.mode, "head_sha256": pos.head_sha256, "cand_head_sha256": pos.cand_head_sha256,
        "load_s": pos.load_s, "score_s": pos.score_s, "scorer_run": pos.scorer_run,
    }, sort_keys=True)
    arrays = {**{f: getattr(pos.scores, f) for f in _SCORE_FIELDS}, "context_index": pos.context_index, "row": pos.row}
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(meta), signature=np.array(_signature(key, meta, arrays, domain)), **arrays)
    atomic_write_bytes(path, buf.getvalue())


class _Meta(TypedDict):
    """The JSON part of a hand-over file (:func:`save_positions`)."""

    schema: str
    binding: JSONObject
    #: ``[index, source cluster, stratum]`` per context
    labels: list[list[int | str]]
    mode: str
    head_sha256: str | None
    cand_head_sha256: str | None
    load_s: float
    score_s: float
    scorer_run: dict[str, str]


#: :class:`_Meta` as a schema (harness.io.schema): what a signed file's JSON part must hold.
_META_SCHEMA = Closed({"schema": str, "binding": MapOf(object), "labels": [[object]], "mode": str,
                       "head_sha256": Nullable(str), "cand_head_sha256": Nullable(str), "load_s": float,
                       "score_s": float, "scorer_run": MapOf(str)})


def _read_signed(path: Path, key: bytes, domain: bytes = b"") -> tuple[_Meta, dict[str, np.ndarray]]:
    """The meta and arrays of a file signed with ``key``; anything else is a VerificationError."""
    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            missing = sorted({"meta", "signature", *_ARRAYS} - names)
            if missing:
                raise VerificationError(path, "shared positions", f"arrays {', '.join(missing)}", "none")
            meta_text, signature = str(z["meta"]), str(z["signature"])
            arrays = {f: z[f] for f in _ARRAYS}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        # a truncated or foreign file; an object (pickled) array is a ValueError under allow_pickle=False
        raise VerificationError(path, "shared positions", "a .npz of plain arrays", f"{type(e).__name__}: {e}") from None
    if not hmac.compare_digest(signature, _signature(key, meta_text, arrays, domain)):
        raise VerificationError(path, "shared positions signature", "signed by this session", "another signature")
    meta: JSONObject = loads_json(meta_text, path)
    if meta.get("schema") != _SCHEMA:
        raise VerificationError(path, "shared positions schema", _SCHEMA, repr(meta.get("schema")))
    check(meta, _META_SCHEMA, path)
    return cast(_Meta, meta), arrays  # checked above, and signed by this session (save_positions wrote it)


def load_positions(path: Path, bound: JSONObject, key: bytes, *, domain: bytes = b"") -> ShardPositions:
    """Read what :func:`save_positions` wrote, believing it only when it is signed with ``key`` and was
    computed from exactly ``bound``; anything else is a VerificationError naming the file."""
    return load_positions_with(path, bound, key, domain=domain)[0]


def load_positions_with(path: Path, bound: JSONObject, key: bytes, *, domain: bytes = b"",
                        extra: tuple[str, ...] = ()) -> tuple[ShardPositions, JSONObject]:
    """:func:`load_positions` of a file whose binding is ``bound`` plus the keys ``extra`` (facts learnt while
    computing, e.g. the engine identity of a capture scored as it ran), returned with those keys' values."""
    from harness.run.shard import ShardPositions

    meta, arrays = _read_signed(path, key, domain)
    got = meta.get("binding")
    found: dict[str, Any] = dict(got) if isinstance(got, dict) else {}
    facts: JSONObject = {k: found.pop(k) for k in extra if k in found}
    if found != bound or set(facts) != set(extra):
        diff = sorted(k for k in {*bound, *found, *extra} if k not in facts and bound.get(k) != found.get(k))
        raise VerificationError(path, f"shared positions computed from ({', '.join(diff)})",
                                {k: bound.get(k) for k in diff}, {k: found.get(k) for k in diff})
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) != 1 or any(v.ndim != 1 or v.dtype.kind not in "fiu" for v in arrays.values()):
        raise VerificationError(path, "shared positions", "numeric arrays of one length", lengths)
    return ShardPositions(
        scores=PositionScores(**{f: arrays[f] for f in _SCORE_FIELDS}),
        context_index=arrays["context_index"], row=arrays["row"],
        labels=[ContextLabel(int(i), c, str(s)) for i, c, s in meta["labels"]],
        mode=str(meta["mode"]), head_sha256=meta["head_sha256"], cand_head_sha256=meta["cand_head_sha256"],
        load_s=float(meta["load_s"]), score_s=float(meta["score_s"]), scorer_run=dict(meta["scorer_run"]),
    ), facts


def scored_once(handover: Handover, name: str, shard: int, bound: JSONObject,
                score: Callable[[], ShardPositions]) -> ShardPositions:
    """The positions of ``name`` x ``shard``: read from the session's folder when a worker of this session
    already scored them from exactly ``bound``, else scored here (under the lock, so no two workers score
    the same shard) and the file (re)written. A file that is not believed is replaced, never used."""
    folder = handover.folder
    if not _FILE.match(f"{name}-shard{shard:02d}.npz"):
        raise FidelityError(f"shared positions: expected a candidate name usable as a file name, found {name!r}")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}-shard{shard:02d}.npz"
    with FileLock(folder / f"{name}-shard{shard:02d}.lock"):
        if target.is_file() and not target.is_symlink():
            try:
                return load_positions(target, bound, handover.key)
            except VerificationError:
                pass  # not believed: scored again below, and the file replaced
        pos = score()
        save_positions(target, pos, bound, handover.key)
        return pos


def remove_session_files(folder: Path, key: bytes, *, remove_folder: bool) -> list[Path]:
    """Remove what this session wrote in ``folder``: hand-over files signed with ``key`` and the lock file
    beside each (empty regular files of the same name). When ``remove_folder`` (this session created the
    folder) also the locks of shards whose scoring failed and the staged files of a killed worker, then the
    folder when nothing else is left. Returns the files left in place (not provably this
    session's)."""
    if folder.is_symlink() or not folder.is_dir():
        return []
    left = []
    for p in sorted(folder.iterdir()):
        if not (p.suffix == ".npz" and _FILE.match(p.name) and p.is_file() and not p.is_symlink()):
            continue
        try:
            _read_signed(p, key)
        except VerificationError:
            left.append(p)
            continue
        p.unlink()
        lock = p.with_suffix(".lock")
        if lock.is_file() and not lock.is_symlink() and lock.stat().st_size == 0:
            lock.unlink()
    if remove_folder:  # a folder this session created: its workers' locks and staged files (of a killed worker)
        for p in sorted(folder.iterdir()):
            ours = (p.suffix == ".lock" and _FILE.match(p.name) and not p.with_suffix(".npz").exists()) \
                or _STAGED.match(p.name)
            if ours and p.is_file() and not p.is_symlink():
                p.unlink()
    if remove_folder:
        remove_empty_folder(folder)
    return left
