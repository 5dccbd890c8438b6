"""A fidelity session: everything one pytest run needs, each piece obtained once.

It loads the suite, the shared head and the reference store once; identifies each live candidate
once (every weight file hashed once per run) and opens and verifies each candidate's capture once
(a stored capture replayed as it is, or a live model captured into a cache keyed by its identity);
builds and verifies one :class:`~harness.run.shard_inputs.ShardInputs` per candidate x shard;
scores it once and turns the result into a :class:`~harness.reports.shard.ShardReport`. It imports
no pytest; the plugin keeps one in ``config.stash``.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from filelock import FileLock

from harness.allocation.bits_per_weight import BitsPerWeight, bits_per_weight
from harness.capture.cache_sign import UntrustedCacheWarning, load_key, unsigned_reason
from harness.capture.loop import capture
from harness.capture.store import CaptureStore
from harness.dataset.verify import verify_dataset
from harness.engines import identity as engine_identity
from harness.engines.base import EngineOptions, LoadedModel
from harness.engines.bf16_path import bf16_path
from harness.engines.identity import identity_key
from harness.engines.numeric_env import numeric_settings
from harness.engines.registry import get_engine, require
from harness.errors import FidelityError, VerificationError
from harness.gate.baselines import Headline, headline_of
from harness.inputs.config import CandidateConfig, FidelityConfig
from harness.inputs.head import HeadTensor, load_head
from harness.inputs.interchange_layout import LAYOUT, scan_layout
from harness.inputs.suite import Suite
from harness.interchange.dataset import PublishedDataset, open_published
from harness.io.jsonio import JSONObject, get_int, read_json
from harness.metrics.bootstrap import DEFAULT_SEED
from harness.metrics.records import ShardSummary
from harness.reports.shard import ShardReport
from harness.run.live_scores import LiveScored, capture_scored, check_live_joins, remove_work
from harness.run.result_cache import ResultCache
from harness.run.reuse import ReuseLog
from harness.run.score_cache import live_binding, live_score_cache, score_binding, score_cache, verify_contents
from harness.run.shard import CandidateMeta, ShardPositions, score_shard, shard_positions
from harness.run.shard_inputs import LiveShardInputs, LiveSide, ShardInputs, verified
from harness.run.shard_summary import shard_metrics
from harness.run.shared_scores import Handover, binding, scored_once
from harness.run.summary_cache import statistics_settings, summary_binding, summary_cache
from harness.run.verify import check_reference_identity


def resolve_device(spec: str, worker_index: int | None = None) -> str:
    """``auto`` -> ``cuda`` when available (one device per xdist worker), else ``cpu``."""
    if spec != "auto":
        return spec
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return f"cuda:{(worker_index or 0) % n}"
    return "cpu"


#: Distributions whose version changes what an engine computes (recorded in a store's engine identity).
_ENGINE_PACKAGES = ("llama_cpp_python", "vllm", "compressed-tensors", "safetensors")


def _engine_packages() -> dict[str, str]:
    """The installed versions of :data:`_ENGINE_PACKAGES` (read from their metadata, nothing imported)."""
    from importlib import metadata

    out = {}
    for dist in _ENGINE_PACKAGES:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def candidate_size_bytes(cand: CandidateConfig) -> int | None:
    """On-disk size: the configured value, else the quantized checkpoint's record, else its weight files."""
    if cand.size_bytes is not None:
        return cand.size_bytes
    if cand.model is None:
        return None
    if cand.model.is_file():  # a single-file model (GGUF)
        return cand.model.stat().st_size
    qfile = cand.model / "quantization.json"
    if qfile.is_file():
        value = get_int(read_json(qfile), "on_disk_bytes", qfile, minimum=0, default=None)
        if isinstance(value, int):
            return value
    files = sorted(cand.model.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) or None


def candidate_bits_per_weight(cand: CandidateConfig) -> BitsPerWeight | None:
    """Bits per weight of the candidate's checkpoint (:mod:`harness.allocation.bits_per_weight`); None for a
    stored capture without a model, a model not on disk, or a format whose quantized modules it cannot name."""
    if cand.model is None or not cand.model.exists():
        return None
    try:
        return bits_per_weight(cand.model)
    except VerificationError:
        return None


@dataclass
class ScoredShard:
    """The outcome of one candidate x shard case."""

    candidate: str
    shard: int
    report: ShardReport
    headline: Headline
    size_bytes: int | None

    def __repr__(self) -> str:
        h = self.headline
        return f"ScoredShard({self.candidate!r}, shard {self.shard:02d}, mean_kld={h.mean_kld:.6g}, top1={h.top1:.4f})"


@dataclass
class FidelitySession:
    """The inputs shared by every case of a run, each loaded, identified or verified once, on first use."""

    config: FidelityConfig
    device: str = "cpu"
    score_from: int = 0
    progress: bool = False
    #: A candidate whose capture or scoring failed: its error, raised again for its other cases without
    #: loading the model again (one broken candidate is loaded once per process).
    _failed: dict[str, FidelityError] = field(default_factory=dict)
    #: pytest-xdist: the folder this session's workers share scored positions through
    #: (:mod:`harness.run.shared_scores`); None in a single process
    shared_scores: Handover | None = None
    #: this user's capture cache key (:mod:`harness.capture.cache_sign`); None: read (or created) from the key
    #: file on first use. A cluster worker gets the driver's in its task payload.
    cache_key: bytes | None = field(default=None, repr=False)
    _suite: Suite | None = None
    _published: PublishedDataset | None = None
    _head: HeadTensor | None = None
    _reference: CaptureStore | None = None
    _cand_heads: dict[str, HeadTensor] = field(default_factory=dict)
    #: each live candidate's identity by content (its weight files hashed once per run)
    _identities: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: each candidate's capture store, opened and verified once per run
    _stores: dict[str, CaptureStore] = field(default_factory=dict)
    #: live candidates' stores opened and verified by a cluster task (:meth:`hold_store`)
    _held: dict[str, CaptureStore] = field(default_factory=dict)
    _inputs: dict[tuple[str, int], ShardInputs] = field(default_factory=dict)
    _planned: dict[str, set[int]] = field(default_factory=dict)
    _positions: dict[tuple[str, int], ShardPositions] = field(default_factory=dict)
    #: each candidate's bits per weight, read once per run
    _bpw: dict[str, BitsPerWeight | None] = field(default_factory=dict)
    #: What the caches served this run instead of computing it (a rerun says so: :mod:`harness.run.reuse`)
    reuse: ReuseLog = field(default_factory=ReuseLog)
    #: The seed of every shard summary's bootstrap draws (a part of the summaries cache's key).
    bootstrap_seed: int = DEFAULT_SEED
    _score_cache: ResultCache[ShardPositions] | None = None
    _live_cache: ResultCache[LiveScored] | None = None
    #: ``keep = "scores"`` candidates: each one's loaded model (while shards planned here remain) and each
    #: candidate x shard's capture header (what its store would have recorded)
    _loaded: dict[str, LoadedModel] = field(default_factory=dict)
    _live_headers: dict[tuple[str, int], JSONObject] = field(default_factory=dict)
    #: ``keep = "scores"`` candidate x shard: the shared head and what its positions are keyed by (:meth:`live_key`)
    _live_keys: dict[tuple[str, int], tuple[HeadTensor, JSONObject]] = field(default_factory=dict)
    _summary_cache: ResultCache[JSONObject] | None = None

    # ------------------------------------------------------------------ inputs
    @property
    def published(self) -> PublishedDataset | None:
        """The dataset in the published layout (:mod:`harness.interchange`), opened and verified once; None otherwise."""
        if self.config.dataset_layout != LAYOUT or self.config.dataset is None:
            return None
        if self._published is None:
            self._published = open_published(scan_layout(self.config.dataset, self.config.reference.head))
        return self._published

    @property
    def custody(self) -> JSONObject | None:
        """The published digests of a dataset read in the published layout (every report's ``comparability.custody``)."""
        return None if self.published is None else dict(self.published.custody)

    @property
    def suite(self) -> Suite:
        """The verified suite (a published dataset's own, when the run reads one)."""
        if self._suite is None:
            published = self.published
            self._suite = published.suite if published is not None else Suite.load(self.config.suite, verify=True)
        return self._suite

    @property
    def head(self) -> HeadTensor:
        """The shared BF16 LM head, verified against its sidecar and the suite's vocabulary."""
        if self._head is None and self.published is not None:
            self._head = self.published.head
        if self._head is None:
            self._head = load_head(self.config.reference.head)
            self._check_head_vocab(self._head, self.config.reference.head)
        return self._head

    def _check_head_vocab(self, head: HeadTensor, path: Path) -> None:
        vocab = int(head.weight.shape[0])
        if vocab < self.suite.vocab_size:
            raise VerificationError(path, "head vocab smaller than the suite's tokenizer vocab", self.suite.vocab_size, vocab)

    def candidate_head(self, cand: CandidateConfig) -> HeadTensor | None:
        """The candidate's own head (head attribution), loaded once; None when it has none."""
        if cand.head is None:
            return None
        if cand.name not in self._cand_heads:
            head = load_head(cand.head)
            self._check_head_vocab(head, cand.head)
            self._cand_heads[cand.name] = head
        return self._cand_heads[cand.name]

    @property
    def reference(self) -> CaptureStore:
        """The verified reference store; captured from the reference model when missing."""
        if self._reference is None and self.published is not None:
            self._reference = self.published.reference
        if self._reference is None:
            ref = self.config.reference
            if self.config.dataset is not None:  # a dataset is trusted only whole (fidelity verify DATASET)
                verify_dataset(self.config.dataset)
            if not (ref.store / "capture.json").exists():
                if ref.model is None:
                    raise FidelityError(
                        f"{ref.store}: reference capture store is missing and no reference.model is "
                        f"configured in {self.config.path} to capture it from"
                    )
                capture("transformers", ref.model, self.suite, ref.store, options=EngineOptions(device=self.device),
                        progress=self.progress)
            store = CaptureStore.open(ref.store, self.suite, verify=True)
            # the configured reference model and the head's source model must be the store's model (the
            # model's identity from its engine, as a live candidate's)
            ident = (get_engine("transformers").model_identity(ref.model)
                     if ref.model is not None and Path(ref.model).is_dir() else None)
            check_reference_identity(store, reference_model=ref.model, model_identity=ident, head=self.head)
            self._reference = store
        return self._reference

    def shard_indices(self, shard: int) -> list[int]:
        return list(self.suite.shard_indices(shard))

    def candidate_store(self, cand: CandidateConfig, shard: int) -> CaptureStore:
        """The candidate's capture covering ``shard``: replayed, or captured live into the cache.
        Opened and verified once per run; a live candidate is captured again only for shards its
        store lacks."""
        store = self._stores.get(cand.name)
        if cand.store is not None:
            if store is None:
                published = self.published
                if published is not None and not (cand.store / "capture.json").is_file():
                    store = published.capture_store(cand.store, cand.name)  # a published capture folder
                else:
                    store = CaptureStore.open(cand.store, self.suite, verify=True)
                self._stores[cand.name] = store
            missing = set(self.shard_indices(shard)) - set(store.indices)
            if missing:
                raise FidelityError(
                    f"{cand.store}: capture store lacks {len(missing)} context(s) of shard {shard:02d} "
                    f"(first missing: {min(missing)})"
                )
            return store
        if store is None or store.missing(self.shard_indices(shard)):
            store = self._capture_live(cand, shard)
            self._stores[cand.name] = store
        return store

    def plan(self, cases: list[tuple[str, int]]) -> None:
        """Declare the cases this process will run, so a live model captures all of its shards at once."""
        for name, shard in cases:
            self._planned.setdefault(name, set()).add(shard)

    def candidate_identity(self, cand: CandidateConfig) -> JSONObject:
        """A live candidate's identity by content, from its engine, computed once per run."""
        if cand.name not in self._identities:
            assert cand.model is not None
            self._identities[cand.name] = get_engine(cand.engine, str(self.config.path)).model_identity(cand.model)
        return self._identities[cand.name]

    def live_store_path(self, cand: CandidateConfig) -> Path:
        """Cache folder of a live candidate's capture, keyed by its identity (by content) and by the runtime
        that captures it (python, torch, transformers, numpy, the harness and the engines' packages): another
        environment sharing the cache gets a store of its own, never a mixed one. So do the settings that are not
        versions but change the engine's numbers (:mod:`harness.engines.numeric_env`: kernel, ISA and precision
        environment variables)."""
        key = identity_key(self.capture_key(cand))
        return self.config.cache_dir / "captures" / f"{cand.name}-{key[:16]}"

    def capture_key(self, cand: CandidateConfig) -> JSONObject:
        """What decides a live candidate's capture (:meth:`live_store_path`'s key; a ``keep = "scores"`` candidate's
        scores are keyed by it in place of a store's content)."""
        keyed: dict[str, Any] = {"model": self.candidate_identity(cand), "engine": cand.engine, "device": self.device,
                                 "runtime": {**engine_identity.runtime_identity(), **_engine_packages()},
                                 "settings": numeric_settings(cand.engine)}
        if cand.engine == "transformers" and bf16_path(self.device) == "fp32":  # bf16 through fp32 kernels
            keyed["bf16_path"] = "fp32"
        if cand.options:  # captures taken with other engine options never share a cache folder
            keyed["options"] = cand.options
        return keyed

    def signing_key(self) -> bytes:
        """The capture cache key, read (or created) once per run."""
        if self.cache_key is None:
            self.cache_key = load_key(self.config.cache_dir)
        return self.cache_key

    def cached_store(self, cand: CandidateConfig, out: Path) -> CaptureStore | None:
        """The live candidate's cache store at ``out`` when this user's harness signed it; None when there is none.

        A folder there whose manifest is unreadable or not validly signed is not believed: it is moved
        aside, whole and untouched, to ``.untrusted-<folder>-<time>-<pid>`` beside it (nothing is deleted), with a
        one-line warning naming both folders, and the candidate is captured again into ``out``."""
        if not out.exists() and not out.is_symlink():
            return None
        with FileLock(out.parent / f".{out.name}.trust-lock"):  # one process moves it; a store being written is signed
            reason = self._untrusted(out)
            if reason is not None:
                aside = out.parent / f".untrusted-{out.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
                try:
                    out.rename(aside)
                except OSError as e:
                    raise VerificationError(out, "an untrusted cache folder moved aside", f"renamed to {aside}",
                                            f"{type(e).__name__}: {e.strerror or e} (nothing was deleted)") from None
                warnings.warn(f"{out}: cached capture of candidate {cand.name!r} not believed: {reason}; moved to {aside} "
                              "and captured again", UntrustedCacheWarning, stacklevel=2)
                return None
        if not (out / "capture.json").exists():
            return None
        store = CaptureStore.open(out, self.suite, verify=True)
        if store.identity != self.candidate_identity(cand):  # a cache folder is believed for its content
            raise VerificationError(out / "capture.json", "model (the cached capture's model identity)",
                                    self.candidate_identity(cand), store.identity)
        return store

    def _untrusted(self, out: Path) -> str | None:
        """Why the cache folder ``out`` is not believed, or None when its manifest is signed with this user's key."""
        mf = out / "capture.json"
        if out.is_symlink() or not out.is_dir():
            return "not a folder of this harness (a symbolic link or a file)"
        if not mf.exists():  # a store being created (its signed manifest comes next) or an interrupted one: the
            return None      # writer lists nothing it did not write and removes only its own leftovers
        try:
            return unsigned_reason(read_json(mf), self.signing_key())
        except VerificationError as e:
            return f"an unreadable manifest ({e.what}: {e.found})"

    def _capture_live(self, cand: CandidateConfig, shard: int) -> CaptureStore:
        """Capture a live candidate into its cache store; the model is loaded once for all planned shards."""
        assert cand.model is not None
        require(get_engine(cand.engine, str(self.config.path)))
        held = self._held.get(cand.name)
        if held is not None and not held.missing(self.shard_indices(shard)):
            return held
        if cand.name in self._failed:  # its load or capture failed already in this run: not loaded again
            raise self._failed[cand.name]
        out = self.live_store_path(cand)
        try:
            store = self.cached_store(cand, out)
            shards = sorted(self._planned.get(cand.name, set()) | {shard})
            wanted = [i for s in shards for i in self.shard_indices(s)]
            missing = set(wanted) if store is None else set(store.missing(wanted))
            if store is not None and not store.missing(self.shard_indices(shard)):
                self.reuse.note("captures", cand.name, reused=set(wanted) - missing, computed=(), where=str(out))
                return store
            opts = EngineOptions(device=self.device, engine_options=cand.options)
            store = capture(cand.engine, cand.model, self.suite, out, shards=shards, options=opts,
                            progress=self.progress, identity=self.candidate_identity(cand), cache_key=self.signing_key())
            self.reuse.note("captures", cand.name, reused=set(wanted) - missing, computed=missing, where=str(out))
            return store
        except VerificationError as e:  # said in the interface of the run: the cache folder is the harness's own
            if not Path(str(e.path)).resolve().is_relative_to(Path(out).resolve()):
                self._failed[cand.name] = e  # the model's own file (a corrupt checkpoint): not the cache's to mend
                raise
            raise VerificationError(e.path, e.what, e.expected, e.found,
                                    hint=f"the capture cache of candidate {cand.name!r} cannot be used: remove the folder "
                                    f"{out} and run pytest again (the candidate is captured again)") from None
        except FidelityError as e:  # the model's own load or capture failed: its other cases re-raise it
            self._failed[cand.name] = e
            raise

    def shard_inputs(self, cand: CandidateConfig, shard: int) -> ShardInputs:
        """The inputs of ``cand`` x ``shard``, built and verified (every join) once per run."""
        key = (cand.name, shard)
        if key not in self._inputs:
            self._inputs[key] = verified(ShardInputs(
                suite=self.suite, shard=shard, reference=self.reference, candidate=self.candidate_store(cand, shard),
                head=self.head, cand_head=self.candidate_head(cand), score_from=self.score_from))
        return self._inputs[key]

    # ------------------------------------------------------------------ scoring
    def positions(self, cand: CandidateConfig, shard: int) -> ShardPositions:
        """The scored positions of a candidate x shard, scored once per session and then cached
        (windows, tails and paired comparisons re-use them; no recapture, no rescoring; under
        pytest-xdist the workers hand them over through :attr:`shared_scores`)."""
        key = (cand.name, shard)
        if key not in self._positions and cand.name in self._failed:
            raise self._failed[cand.name]
        if key not in self._positions:
            try:
                return self._score_positions(cand, shard)
            except FidelityError as e:
                if not isinstance(e, VerificationError):  # a load or capture failure of the candidate itself
                    self._failed[cand.name] = e
                raise
        return self._positions[key]

    def _score_positions(self, cand: CandidateConfig, shard: int) -> ShardPositions:
        key = (cand.name, shard)
        if key not in self._positions and cand.keep == "scores" and cand.model is not None:
            self._positions[key] = self._live_positions(cand, shard)
        if key not in self._positions:
            inputs = self.shard_inputs(cand, shard)

            def score() -> ShardPositions:
                if self.shared_scores is None:
                    return shard_positions(inputs, device=self.device)
                # another worker of this session may have scored it already
                bound = binding(session=self.shared_scores.session, candidate=cand.name, suite=inputs.suite, shard=shard,
                                reference=inputs.reference, cand_store=inputs.candidate, head=inputs.head,
                                cand_head=inputs.cand_head, window=inputs.score_from, device=self.device)
                return scored_once(self.shared_scores, cand.name, shard, bound,
                                   lambda: shard_positions(inputs, device=self.device))

            if not self.config.score_cache:  # [settings] score_cache = false: scored, nothing read or kept
                self._positions[key] = score()
                return self._positions[key]
            cache, stem = self.score_cache, f"{cand.name}-shard{shard:02d}"
            n_reused = len(cache.reused)
            pos = cache.get(stem, score_binding(inputs, cand.name, self.device), score)
            reused = len(cache.reused) > n_reused
            if reused:  # read, not scored: the files it was scored from must still hold what the key names
                verify_contents(inputs)
            self.reuse.note("scores", cand.name, reused=[shard] if reused else [], computed=[] if reused else [shard],
                            where=str(cache.folder))
            self._positions[key] = pos
        return self._positions[key]

    def _live_positions(self, cand: CandidateConfig, shard: int) -> ShardPositions:
        """``keep = "scores"``: the candidate x shard scored while it is captured (:mod:`harness.run.live_scores`),
        or read from the scores cache; its hidden states are never written. Concurrent processes (xdist workers,
        cluster tasks) computing one shard take the entry's lock: the second reads what the first kept."""
        assert cand.model is not None
        head, bound = self.live_key(cand, shard)
        cache, stem = self.live_cache, f"{cand.name}-shard{shard:02d}"
        work = cache.path(stem, bound)
        work = work.with_name(f".{work.stem}.parts")

        def compute() -> LiveScored:
            return capture_scored(lambda: self._live_model(cand), model=cand.model or Path(), engine=cand.engine,
                                  suite=self.suite, shard=shard, reference=self.reference, head=head,
                                  cand_head=self.candidate_head(cand), device=self.device, work=work,
                                  key=self.signing_key(), bound=bound, progress=self.progress)

        n_reused = len(cache.reused)
        try:
            got = cache.get(stem, bound, compute)
        except BaseException:  # a failed capture or scoring: its model is not held for the candidate's other cases
            if cand.name in self._loaded:
                self._loaded.pop(cand.name).close()
            raise
        remove_work(work)
        reused = len(cache.reused) > n_reused
        if reused:  # read, not scored: the reference files it was scored from must still hold what the key names
            for i in self.shard_indices(shard):
                self.reference.load(i)
        self.reuse.note("scores", cand.name, reused=[shard] if reused else [], computed=[] if reused else [shard],
                        where=str(cache.folder))
        self._live_headers[(cand.name, shard)] = got.header
        self._release_live(cand, shard)
        return got.positions

    def live_key(self, cand: CandidateConfig, shard: int) -> tuple[HeadTensor, JSONObject]:
        """A ``keep = "scores"`` candidate x shard's joins, checked (:func:`check_live_joins`: the shared head it is
        scored through), and what its positions are keyed by (:func:`live_binding`); once per run."""
        key = (cand.name, shard)
        if key not in self._live_keys:
            head = check_live_joins(self.suite, shard, self.reference, self.head, self.candidate_head(cand),
                                    self.score_from)
            bound = live_binding(candidate=cand.name, capture=self.capture_key(cand), suite=self.suite, shard=shard,
                                 reference=self.reference, head=head, cand_head=self.candidate_head(cand),
                                 window=self.score_from, device=self.device)
            self._live_keys[key] = (head, bound)
        return self._live_keys[key]

    def _live_model(self, cand: CandidateConfig) -> LoadedModel:
        """A ``keep = "scores"`` candidate's model, loaded once for the shards this process scores."""
        if cand.name not in self._loaded:
            assert cand.model is not None
            eng = get_engine(cand.engine, str(self.config.path))
            require(eng)
            opts = EngineOptions(device=self.device, engine_options=cand.options)
            self._loaded[cand.name] = eng.load(cand.model, self.suite.n_ctx, "hidden_states", opts)
        return self._loaded[cand.name]

    def _release_live(self, cand: CandidateConfig, shard: int) -> None:
        """Close the candidate's model once every shard planned for it here is scored (or after an unplanned one)."""
        left = self._planned.get(cand.name, set()) - {s for (n, s) in self._live_headers if n == cand.name} - {shard}
        if not left and cand.name in self._loaded:
            self._loaded.pop(cand.name).close()

    def live_inputs(self, cand: CandidateConfig, shard: int) -> LiveShardInputs:
        """The inputs of a ``keep = "scores"`` candidate x shard, after its positions (which give its header)."""
        self.positions(cand, shard)
        header = self._live_headers[(cand.name, shard)]
        side = LiveSide(identity=self.candidate_identity(cand), manifest=header, root=self.live_cache.folder)
        return LiveShardInputs(suite=self.suite, shard=shard, reference=self.reference, candidate=side, head=self.head,
                               cand_head=self.candidate_head(cand), score_from=self.score_from)

    @property
    def live_cache(self) -> ResultCache[LiveScored]:
        """Scores of candidates scored while captured (:func:`harness.run.score_cache.live_score_cache`)."""
        if self._live_cache is None:
            self._live_cache = live_score_cache(self.config.cache_dir, self.signing_key())
        return self._live_cache

    def summary(self, cand: CandidateConfig, shard: int, pos: ShardPositions, n_boot: int) -> ShardSummary:
        """The ``metrics`` block of ``cand`` x ``shard`` from the summaries cache (:mod:`harness.run.summary_cache`),
        computed and kept when it holds none (keyed by what its positions are keyed by: the stores' content, or a
        ``keep = "scores"`` candidate's capture); with ``[settings] score_cache = false`` computed, nothing kept."""
        seed = self.bootstrap_seed
        if not self.config.score_cache:
            return shard_metrics(pos, score_from=self.score_from, n_boot=n_boot, seed=seed)
        live = cand.keep == "scores" and cand.model is not None
        positions = self.live_key(cand, shard)[1] if live else score_binding(self.shard_inputs(cand, shard), cand.name,
                                                                             self.device)
        if self._summary_cache is None:
            self._summary_cache = summary_cache(self.config.cache_dir, self.signing_key())
        cache, stem = self._summary_cache, f"{cand.name}-shard{shard:02d}"
        n_reused = len(cache.reused)
        bound = summary_binding(positions, statistics_settings(n_boot, seed))
        metrics = cache.get(stem, bound, lambda: cast(JSONObject, shard_metrics(
            pos, score_from=self.score_from, n_boot=n_boot, seed=seed)))
        reused = len(cache.reused) > n_reused
        self.reuse.note("summary", cand.name, reused=[shard] if reused else [], computed=[] if reused else [shard],
                        where=str(cache.folder))
        return cast(ShardSummary, metrics)

    @property
    def score_cache(self) -> ResultCache[ShardPositions]:
        """Scored positions kept across runs (:mod:`harness.run.score_cache`), signed with this user's key."""
        if self._score_cache is None:
            self._score_cache = score_cache(self.config.cache_dir, self.signing_key())
        return self._score_cache

    def hold_store(self, name: str, store: CaptureStore) -> None:
        """A live candidate's capture store, opened and verified by the caller (a cluster task, under the
        store's task lock): this session scores from it instead of opening the store again."""
        self._held[name] = store

    def adopt(self, name: str, shard: int, positions: ShardPositions) -> None:
        """Positions of ``name`` x ``shard`` scored elsewhere (a cluster task, already verified): the
        tail, window and paired cases of this session read them instead of scoring again."""
        self._positions[(name, shard)] = positions

    def forget(self, name: str, shard: int) -> None:
        """Drop the cached positions of ``name`` x ``shard`` (a cluster worker hands them to the driver)."""
        self._positions.pop((name, shard), None)

    def verify_joins(self, cand: CandidateConfig, shard: int) -> None:
        """The identity checks ``fidelity replay`` runs (:func:`harness.run.verify.verify_joins`), before any
        position of ``cand`` x ``shard`` is scored: building its :class:`ShardInputs` (once per run)."""
        self.shard_inputs(cand, shard)

    def score(self, cand: CandidateConfig, shard: int, *, n_boot: int | None = None) -> ScoredShard:
        """Score one candidate x shard and build its report."""
        t0 = time.perf_counter()
        size = candidate_size_bytes(cand)
        if cand.name not in self._bpw:
            self._bpw[cand.name] = candidate_bits_per_weight(cand)
        meta: CandidateMeta = {"size_bytes": size, "tags": list(cand.tags), "bits_per_weight": self._bpw[cand.name]}
        live = cand.keep == "scores" and cand.model is not None
        positions = self.positions(cand, shard)
        report = score_shard(
            self.live_inputs(cand, shard) if live else self.shard_inputs(cand, shard),
            positions=positions,
            metrics=self.summary(cand, shard, positions, n_boot or self.config.n_boot),
            reference_name=self.config.reference.name,
            candidate_name=cand.name,
            candidate_meta=meta,
            n_boot=n_boot or self.config.n_boot,
            device=self.device,
            custody=self.custody,
        )
        report.timing["total_s"] = time.perf_counter() - t0
        report.timing["scores"] = "cache" if shard in self.reuse.served("scores", cand.name) else "scored"
        return ScoredShard(cand.name, shard, report, headline_of(report.metrics), size)
