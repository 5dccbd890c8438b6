"""Scored positions kept across runs: a rerun of an unchanged ladder reads them instead of scoring again.

Each candidate x shard's :class:`~harness.run.shard.ShardPositions` is one entry of a
:class:`~harness.run.result_cache.ResultCache` in ``<cache_dir>/scores/`` (``<candidate>-shardNN-<key>.npz``),
signed with this user's capture cache key under the domain :data:`PROTOCOL`. Its binding (:func:`score_binding`):
the xdist hand-over's (:func:`harness.run.shared_scores.binding` without a session: candidate, both stores' content
sha256, suite and shard sha256, window, scorer settings, heads) plus :data:`PROTOCOL`, the runtime, the torch
numeric settings and the CPU capability; a candidate scored while captured has no store, and :func:`live_binding`
names its capture instead. Anything else changed is another key: scored, never read. On a hit the stores' context
files of the shard are still content-verified, so a store edited behind its manifest is refused as without the
cache. docs/performance.md ("Reruns"), docs/configuration.md ("What a live candidate keeps").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.capture.store import CaptureStore
from harness.engines.identity import runtime_identity
from harness.engines.numeric_env import numeric_settings
from harness.errors import VerificationError
from harness.inputs.head import HeadTensor
from harness.inputs.suite import Suite
from harness.io.jsonio import JSONObject
from harness.run.live_scores import HEADER, LiveScored
from harness.run.result_cache import ResultCache, cache_entries
from harness.run.shard import SCORER_SETTINGS
from harness.run.shared_scores import binding, load_positions, load_positions_with, save_positions, store_content_sha256
from harness.scoring.backends import scoring_env

if TYPE_CHECKING:
    from harness.inputs.config import FidelityConfig
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


def _environment() -> JSONObject:
    """What every key holds besides the inputs: the protocol and what decides the scorer's numbers on this machine."""
    return {"protocol": PROTOCOL, "runtime": dict(runtime_identity()),
            "numeric_settings": numeric_settings("transformers"), "cpu_capability": cpu_capability()}


def score_binding(inputs: ShardInputs, candidate: str, device: str) -> JSONObject:
    """Everything the positions of ``candidate`` x ``inputs.shard`` are computed from (module docstring)."""
    bound = binding(session=None, candidate=candidate, suite=inputs.suite, shard=inputs.shard,
                    reference=inputs.reference, cand_store=inputs.candidate, head=inputs.head,
                    cand_head=inputs.cand_head, window=inputs.score_from, device=device)
    return {**bound, **_environment()}


def live_binding(*, candidate: str, capture: JSONObject, suite: Suite, shard: int, reference: CaptureStore,
                 head: HeadTensor | None, cand_head: HeadTensor | None, window: int, device: str) -> JSONObject:
    """Everything the positions of a candidate scored while captured (``keep = "scores"``) are computed from.

    There is no candidate store whose content could be hashed; its place is taken by what decides the capture:
    ``capture``, the key of the capture cache folder the candidate would have had (its model's identity by
    content, engine, device, engine options, runtime and engine packages, numeric settings), with the suite's and
    the shard's sha256 (the tokens it runs on). The rest is :func:`score_binding`'s (reference content, window,
    scorer, heads, protocol and this machine's numeric path), plus ``keep``."""
    indices = list(suite.shard_indices(shard))
    scorer: JSONObject = {**SCORER_SETTINGS, "device": device, "env": dict(scoring_env())}
    return {"keep": "scores", "candidate": candidate, "candidate_capture": capture,
            "reference_identity": reference.identity, "reference_store_sha256": store_content_sha256(reference, indices),
            "suite_token_sha256": suite.suite_token_sha256, "shard": shard, "shard_sha256": suite.shard(shard).sha256,
            "window": window, "scorer": scorer, "head_sha256": getattr(head, "sha256", None),
            "cand_head_sha256": getattr(cand_head, "sha256", None), **_environment()}


def score_cache(cache_dir: Path, key: bytes) -> ResultCache[ShardPositions]:
    """The scored-positions cache under ``cache_dir``, signed with ``key`` (this user's cache key)."""

    def write(path: Path, pos: ShardPositions, bound: JSONObject) -> None:
        save_positions(path, pos, bound, key, domain=_DOMAIN)

    def read(path: Path, bound: JSONObject) -> ShardPositions:
        return load_positions(path, bound, key, domain=_DOMAIN)

    return ResultCache(folder=Path(cache_dir) / FOLDER, key=key, read=read, write=write)


def live_score_cache(cache_dir: Path, key: bytes) -> ResultCache[LiveScored]:
    """The entries of candidates scored while captured, beside the others in ``<cache_dir>/scores/``: each also
    carries, bound and signed with it, its capture's header (:data:`harness.run.live_scores.HEADER`)."""

    def write(path: Path, got: LiveScored, bound: JSONObject) -> None:
        save_positions(path, got.positions, {**bound, HEADER: got.header}, key, domain=_DOMAIN)

    def read(path: Path, bound: JSONObject) -> LiveScored:
        pos, facts = load_positions_with(path, bound, key, domain=_DOMAIN, extra=(HEADER,))
        header = facts[HEADER]
        if not isinstance(header, dict):
            raise VerificationError(path, HEADER, "an object", type(header).__name__)
        return LiveScored(pos, header)

    return ResultCache(folder=Path(cache_dir) / FOLDER, key=key, read=read, write=write)


def verify_contents(inputs: ShardInputs) -> None:
    """Content-verify both stores' context files of the shard (what scoring would have read): a cached
    entry is keyed by the manifests' sha256, this checks the files still hold them."""
    for store in (inputs.reference, inputs.candidate):
        for i in inputs.indices:
            store.load(i)


def scores_cache_line(config: FidelityConfig) -> str:
    """The session header's line on the scores cache: where it is and how many entries it holds, or that it is off."""
    if not config.score_cache:
        return ("fidelity: scores cache off (--fidelity-no-score-cache or [settings] score_cache = false): every "
                "candidate x shard is scored and summarized, nothing read from or kept in "
                f"{Path(config.cache_dir) / FOLDER}/")
    folder = Path(config.cache_dir) / FOLDER
    n = len(cache_entries(folder))
    return (f"fidelity: scores cache {folder}/ ({n} entr{'y' if n == 1 else 'ies'}; a candidate x "
            "shard scored before from unchanged inputs is read, not scored)")
