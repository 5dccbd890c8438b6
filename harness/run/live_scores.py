"""Score while capturing (``keep = "scores"``): hidden states go from the engine to the scorer in memory, never to disk.

:func:`capture_scored` scores one candidate x shard in the very tiles the store-then-score path scores it in
(:func:`harness.scoring.streaming.score_groups`, :func:`harness.scoring.torch_path.tile_plan`): a tile is scored
as soon as the engine has produced its rows, with the same plan, so its numbers are those of scoring a stored
capture. Each scored tile is appended to a work folder as ``part-<first row>.npz`` (signed with this user's cache
key, bound to what the shard is computed from, written atomically and fsynced); a run killed at any instant
(``kill -9``) resumes at the first tile not on disk, capturing again only the contexts from the first one without
all of its scores. Only the reference is read from a store. docs/configuration.md ("keep"), docs/performance.md.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.capture.loop import check_finite_output
from harness.capture.store import CaptureStore
from harness.engines.identity import runtime_identity
from harness.errors import FidelityError, VerificationError
from harness.io.jsonio import JSONObject
from harness.metrics import ContextLabel
from harness.metrics.scores import PositionScores
from harness.run.shard import ShardPositions
from harness.run.shared_scores import load_positions_with, save_positions
from harness.run.verify import check_contexts, check_window

if TYPE_CHECKING:
    import torch

    from harness.engines.base import LoadedModel
    from harness.inputs.head import HeadTensor
    from harness.inputs.suite import Suite
    from harness.scoring.torch_path import ShardTile

__all__ = ["HEADER", "LiveScored", "capture_scored", "check_live_joins", "remove_work"]

#: The signature's domain of a part file (a part is never believed as any other kind of file).
PART_DOMAIN = b"fidelity.score-part/1\n"
#: The binding key under which a part (and the cached entry) carries the capture's header (learnt on load).
HEADER = "candidate_header"
_PART = re.compile(r"^part-(\d{9})\.npz$")
_STAGED = re.compile(r"^\.part-\d{9}\.npz\.[A-Za-z0-9_]+\.tmp$")


@dataclass
class LiveScored:
    """What :func:`capture_scored` gives: the shard's positions, the capture's header (what a store's manifest
    would record: engine, runtime, device, kind, dtype, hidden_size) and the contexts this call captured."""

    positions: ShardPositions
    header: JSONObject
    captured: list[int] = field(default_factory=list)


def check_live_joins(suite: Suite, shard: int, reference: CaptureStore, head: HeadTensor | None,
                     cand_head: HeadTensor | None, score_from: int) -> HeadTensor:
    """The joins a candidate scored while captured needs before anything runs: a hidden-state reference holding
    the shard, the window, the shared head of the reference's width (and a candidate head of the same shape)."""
    where = reference.root / "capture.json"
    if reference.kind != "hidden_states":
        raise VerificationError(where, "reference store kind (a candidate with keep = \"scores\" is scored through "
                                "the shared head)", "hidden_states", reference.kind)
    check_window(suite, [reference], score_from)
    check_contexts([reference], suite, [shard])
    if head is None:
        raise VerificationError(where, "shared head", "a head for a hidden-state reference", "none given")
    if head.hidden_size != reference.width:
        raise VerificationError(head.path, f"head hidden_size (the width of {where})", reference.width, head.hidden_size)
    if cand_head is not None and tuple(cand_head.weight.shape) != tuple(head.weight.shape):
        raise VerificationError(cand_head.path, "candidate head shape", list(head.weight.shape), list(cand_head.weight.shape))
    return head


def _header(loaded: LoadedModel, width: int) -> JSONObject:
    """What a store of this capture would record in its manifest (besides the model's identity)."""
    return {"engine": dict(loaded.identity()), "runtime": dict(runtime_identity()), "device": str(loaded.device),
            "kind": "hidden_states", "dtype": "bfloat16", "hidden_size": width}


def _read_parts(work: Path, tiles: list[ShardTile], bound: JSONObject, key: bytes) -> tuple[list[ShardPositions], JSONObject | None]:
    """The believed prefix of the work folder's parts (signed, bound to ``bound`` and its tile, one header);
    every other part file there is removed (a part after a gap, of other inputs, or not this harness's)."""
    parts: list[ShardPositions] = []
    header: JSONObject | None = None
    for t in tiles:
        p = work / f"part-{t.r0:09d}.npz"
        if p.is_symlink() or not p.is_file():
            break
        try:
            pos, facts = load_positions_with(p, {**bound, "rows": [t.r0, t.r1]}, key, domain=PART_DOMAIN, extra=(HEADER,))
        except VerificationError:
            break
        got = facts[HEADER]
        if not isinstance(got, dict) or (header is not None and got != header) or len(pos.row) != t.r1 - t.r0:
            break
        header = got
        parts.append(pos)
    end = tiles[len(parts) - 1].r1 if parts else 0
    for p in sorted(work.iterdir()):
        m = _PART.match(p.name)
        if (m and int(m.group(1)) >= end) or _STAGED.match(p.name):
            if p.is_file() or p.is_symlink():
                p.unlink()
    return parts, header


def remove_work(work: Path) -> None:
    """Remove a work folder this module wrote (its parts and staged files), once its shard's entry is kept."""
    if work.is_symlink() or not work.is_dir():
        return
    for p in work.iterdir():
        if (_PART.match(p.name) or _STAGED.match(p.name)) and p.is_file() and not p.is_symlink():
            p.unlink()
    try:
        work.rmdir()
    except OSError:  # something else is in it: left as it is
        pass


def capture_scored(
    open_model: Callable[[], LoadedModel],
    *,
    model: Path,
    engine: str,
    suite: Suite,
    shard: int,
    reference: CaptureStore,
    head: HeadTensor,
    cand_head: HeadTensor | None,
    device: str,
    work: Path,
    key: bytes,
    bound: JSONObject,
    tile_rows: int | None = None,
    progress: bool = False,
) -> LiveScored:
    """Capture ``suite``'s shard ``shard`` of ``model`` through ``open_model()`` (engine ``engine``) (called only when a context is still to be
    scored; the caller owns the loaded model) and score it tile by tile against ``reference`` (module docstring).

    ``work``: the folder the scored tiles are appended to (resumed from); ``key``, ``bound``: this user's cache key
    and what the shard is computed from, which every part is signed with and bound to. ``tile_rows``: a fixed
    tile (as :func:`harness.scoring.scorer.score_hidden` takes it); None: the store-then-score path's own tiles."""
    import torch
    from tqdm import tqdm

    from harness.scoring.scorer import score_hidden, scorer_run, shard_tiles

    indices = list(suite.shard_indices(shard))
    rows = suite.n_ctx - 1
    width = reference.width
    tiles = shard_tiles(len(indices), rows, width, head.weight, device, tile_rows)
    targets = torch.from_numpy(suite.tokens[indices, 1:].astype(np.int64).reshape(-1))
    cand_w = None if cand_head is None else cand_head.weight
    probe = torch.empty(0, width, dtype=torch.bfloat16)
    ran = scorer_run(probe, probe, head.weight, cand_w, device=device).as_dict()
    mode, head_sha, cand_sha = "hidden_states", head.sha256, None if cand_head is None else cand_head.sha256
    work.mkdir(parents=True, exist_ok=True)
    parts, header = _read_parts(work, tiles, bound, key)
    captured: list[int] = []
    if len(parts) < len(tiles):
        loaded = open_model()
        if loaded.vocab_size < suite.vocab_size:
            raise FidelityError(f"{model}: model vocab {loaded.vocab_size} is smaller than the suite's tokenizer vocab "
                                f"{suite.vocab_size} ({suite.root / 'suite.json'})")
        if loaded.hidden_size != width:
            raise VerificationError(model, "hidden size (the reference store's width)", width, loaded.hidden_size)
        now = _header(loaded, width)
        if header is not None and now != header:  # scored by another engine setting: none of it is kept
            parts = []
            _read_parts(work, [], bound, key)
        header = now
        done = tiles[len(parts) - 1].r1 if parts else 0
        first = done // rows  # the first context without all of its scores
        pending = torch.empty(0, width, dtype=torch.bfloat16)
        pending_r0 = first * rows
        k = len(parts)
        ref_cache: dict[int, torch.Tensor] = {}
        batch = max(1, int(getattr(loaded, "batch_size", 1)))
        todo = list(range(first, len(indices)))
        bar = tqdm(total=len(indices), initial=first, desc=f"capture+score {model.name}", unit="ctx", disable=not progress)
        with bar:
            for b0 in range(0, len(todo), batch):
                group = todo[b0 : b0 + batch]
                t0 = time.perf_counter()
                if batch == 1:
                    outs = [loaded.forward(suite.tokens[indices[group[0]]], "hidden_states")]
                else:
                    outs = loaded.forward_batch([suite.tokens[indices[p]] for p in group], "hidden_states")
                load_s = time.perf_counter() - t0
                if len(outs) != len(group):
                    raise FidelityError(f"{model}: the engine returned {len(outs)} contexts for a batch of {len(group)}")
                for p, out in zip(group, outs, strict=True):
                    check_finite_output(model, engine, "hidden_states", indices[p], out)
                    if out.dtype != torch.bfloat16 or tuple(out.shape) != (rows, width):
                        raise FidelityError(f"{model}: context {indices[p]}: expected bfloat16 hidden states of shape "
                                            f"[{rows}, {width}], found {out.dtype} {list(out.shape)}")
                    pending = torch.cat([pending, out.detach().cpu()])
                    captured.append(indices[p])
                while k < len(tiles) and pending_r0 + pending.shape[0] >= tiles[k].r1:
                    t = tiles[k]
                    t1 = time.perf_counter()
                    cand = pending[t.r0 - pending_r0 : t.r1 - pending_r0]
                    ref = _reference_rows(reference, indices, rows, t, ref_cache)
                    s = score_hidden(ref, cand, head.weight, targets[t.r0 : t.r1], cand_head=cand_w, device=device,
                                     tile_rows=t.r1 - t.r0, chunk_rows=t.chunk, compiled=t.compiled)
                    part = _part(s, indices, rows, t, mode, head_sha, cand_sha, load_s, time.perf_counter() - t1, ran)
                    _check_finite(part, model)
                    save_positions(work / f"part-{t.r0:09d}.npz", part, {**bound, "rows": [t.r0, t.r1], HEADER: header},
                                   key, domain=PART_DOMAIN)
                    parts.append(part)
                    pending, pending_r0 = pending[t.r1 - pending_r0 :].clone(), t.r1
                    load_s = 0.0
                    k += 1
                bar.update(len(group))
    assert header is not None and len(parts) == len(tiles)
    return LiveScored(_whole(parts, suite, indices, rows, mode, head_sha, cand_sha, ran), header, captured)


def _reference_rows(reference: CaptureStore, indices: list[int], rows: int, t: ShardTile,
                    cache: dict[int, torch.Tensor]) -> torch.Tensor:
    """The reference's rows ``[t.r0, t.r1)`` of the shard (contexts read once; a context a tile shares with the
    next stays until that tile is scored)."""
    import torch

    first, last = t.r0 // rows, (t.r1 - 1) // rows
    for p in [p for p in cache if p < first]:
        del cache[p]
    for p in range(first, last + 1):
        if p not in cache:
            cache[p] = reference.load(indices[p])
    both = torch.cat([cache[p] for p in range(first, last + 1)])
    return both[t.r0 - first * rows : t.r1 - first * rows]


def _part(s: PositionScores, indices: list[int], rows: int, t: ShardTile, mode: str, head_sha: str | None,
          cand_sha: str | None, load_s: float, score_s: float, ran: dict[str, str]) -> ShardPositions:
    """One scored tile as positions: its scores, and each row's context index and row within the context."""
    flat = np.arange(t.r0, t.r1, dtype=np.int64)
    ctx = np.asarray(indices, dtype=np.int64)[flat // rows]
    return ShardPositions(s, ctx, flat % rows, [], mode, head_sha, cand_sha, load_s, score_s, ran)


def _check_finite(part: ShardPositions, model: Path) -> None:
    """Refuse non-finite scores, naming the model, the context and the row (there is no candidate file to name)."""
    bad = np.flatnonzero(~np.isfinite(part.scores.kld))
    if bad.size:
        i = int(bad[0])
        raise FidelityError(f"{model}: context {int(part.context_index[i])}, row {int(part.row[i])}: expected scores "
                            f"whose fp32 logits are finite, found {bad.size} non-finite position(s) in the tile "
                            "(a finite but huge hidden state overflows the logits); nothing of this tile was kept")


def _whole(parts: list[ShardPositions], suite: Suite, indices: list[int], rows: int, mode: str, head_sha: str | None,
           cand_sha: str | None, ran: dict[str, str]) -> ShardPositions:
    """The shard's positions from its tiles, in order (what :func:`harness.run.shard.shard_positions` returns)."""
    scores = PositionScores.empty(len(indices) * rows)
    for name, arr in scores.to_dict().items():
        arr[:] = np.concatenate([getattr(p.scores, name) for p in parts])
    labels = [ContextLabel(index=c.index, source_cluster=c.source_cluster, stratum=c.stratum)
              for c in (suite.contexts[i] for i in indices)]
    return ShardPositions(scores, np.concatenate([p.context_index for p in parts]), np.concatenate([p.row for p in parts]),
                          labels, mode, head_sha, cand_sha, sum(p.load_s for p in parts), sum(p.score_s for p in parts), ran)
