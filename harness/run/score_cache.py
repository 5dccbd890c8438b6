"""Scored positions kept across runs: a rerun of an unchanged ladder reads them instead of scoring again.

Each candidate x shard's :class:`~harness.run.shard.ShardPositions` is one entry of a
:class:`~harness.run.result_cache.ResultCache` in ``<cache_dir>/scores/`` (``<candidate>-shardNN-<key>.npz``),
signed with this user's capture cache key under the domain :data:`PROTOCOL`. Its binding
(:func:`score_binding`) is the xdist hand-over's (:func:`harness.run.shared_scores.binding`, without a
session: the candidate's name and identity, both stores' content sha256 over the shard's context files, the
suite and shard sha256, the window, the scorer settings with the scoring environment variables, both heads'
sha256) plus :data:`PROTOCOL`, the runtime's versions, the torch numeric settings and the CPU capability torch
dispatches for. Anything else changed is another key: scored, never read. On a hit both stores' context files
of the shard are still content-verified (sha256, as a scoring run does), so a store edited behind its manifest
is refused exactly as without the cache. docs/performance.md ("Reruns").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.engines.identity import runtime_identity
from harness.engines.numeric_env import numeric_settings
from harness.io.jsonio import JSONObject
from harness.run.result_cache import ResultCache, cache_entries
from harness.run.shared_scores import binding, load_positions, save_positions

if TYPE_CHECKING:
    from harness.run.shard import ShardPositions
    from harness.run.shard_inputs import ShardInputs

#: The protocol (and file format) of an entry: a part of every key and the signature's domain.
PROTOCOL = "fidelity.score-cache/1"
_DOMAIN = f"{PROTOCOL}\n".encode("ascii")
#: The folder under ``[settings] cache_dir``.
FOLDER = "scores"


def cpu_capability() -> str:
    """The instruction set torch dispatches its CPU kernels for (``ATEN_CPU_CAPABILITY`` lowers it)."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def score_binding(inputs: ShardInputs, candidate: str, device: str) -> JSONObject:
    """Everything the positions of ``candidate`` x ``inputs.shard`` are computed from (module docstring)."""
    bound = binding(session=None, candidate=candidate, suite=inputs.suite, shard=inputs.shard,
                    reference=inputs.reference, cand_store=inputs.candidate, head=inputs.head,
                    cand_head=inputs.cand_head, window=inputs.score_from, device=device)
    return {**bound, "protocol": PROTOCOL, "runtime": dict(runtime_identity()),
            "numeric_settings": numeric_settings("transformers"), "cpu_capability": cpu_capability()}


def score_cache(cache_dir: Path, key: bytes) -> ResultCache[ShardPositions]:
    """The scored-positions cache under ``cache_dir``, signed with ``key`` (this user's cache key)."""

    def write(path: Path, pos: ShardPositions, bound: JSONObject) -> None:
        save_positions(path, pos, bound, key, domain=_DOMAIN)

    def read(path: Path, bound: JSONObject) -> ShardPositions:
        return load_positions(path, bound, key, domain=_DOMAIN)

    return ResultCache(folder=Path(cache_dir) / FOLDER, key=key, read=read, write=write)


def verify_contents(inputs: ShardInputs) -> None:
    """Content-verify both stores' context files of the shard (what scoring would have read): a cached
    entry is keyed by the manifests' sha256, this checks the files still hold them."""
    for store in (inputs.reference, inputs.candidate):
        for i in inputs.indices:
            store.load(i)


def scores_cache_line(cache_dir: Path) -> str:
    """The session header's line on the scores cache: where it is and how many entries it holds."""
    n = len(cache_entries(Path(cache_dir) / FOLDER))
    return (f"fidelity: scores cache {Path(cache_dir) / FOLDER}/ ({n} entr{'y' if n == 1 else 'ies'}; a candidate x "
            "shard scored before from unchanged inputs is read, not scored)")

