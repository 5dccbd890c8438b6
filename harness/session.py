"""A fidelity session: everything one pytest run (or one ``fidelity replay``) needs.

It loads the suite, the shared head and the reference store once, obtains each
candidate's capture (a stored capture replayed as it is, or a live model captured
into a cache keyed by the candidate's identity), scores one shard at a time and
turns the result into a :class:`~harness.report.ShardReport`. It imports no pytest;
the plugin keeps one in ``config.stash``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import harness
from harness.baselines import Headline
from harness.config import CandidateConfig, FidelityConfig
from harness.errors import FidelityError


def resolve_device(spec: str, worker_index: int | None = None) -> str:
    """``auto`` -> ``cuda`` when available (one device per xdist worker), else ``cpu``."""
    if spec != "auto":
        return spec
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return f"cuda:{(worker_index or 0) % n}"
    return "cpu"


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
        import json

        try:
            value = json.loads(qfile.read_text()).get("on_disk_bytes")
        except ValueError:
            value = None
        if isinstance(value, int):
            return value
    files = sorted(cand.model.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) or None


@dataclass
class ScoredShard:
    """The outcome of one candidate x shard case."""

    candidate: str
    shard: int
    report: Any  # harness.report.ShardReport
    headline: Headline
    size_bytes: int | None

    def __repr__(self) -> str:
        h = self.headline
        return f"ScoredShard({self.candidate!r}, shard {self.shard:02d}, mean_kld={h.mean_kld:.6g}, top1={h.top1:.4f})"


@dataclass
class FidelitySession:
    """Lazily loaded inputs shared by every case of a run."""

    config: FidelityConfig
    device: str = "cpu"
    score_from: int = 0
    progress: bool = False
    _suite: Any = None
    _head: Any = None
    _reference: Any = None
    _cand_heads: dict[str, Any] = field(default_factory=dict)
    _stores: dict[str, Any] = field(default_factory=dict)
    _planned: dict[str, set[int]] = field(default_factory=dict)
    _positions: dict[tuple[str, int], "ShardPositions"] = field(default_factory=dict)

    # ------------------------------------------------------------------ inputs
    @property
    def suite(self) -> Any:
        if self._suite is None:
            from harness.suite import Suite

            self._suite = Suite.load(self.config.suite, verify=True)
        return self._suite

    @property
    def head(self) -> Any:
        if self._head is None:
            from harness.head import load_head

            self._head = load_head(self.config.reference.head)
            self._check_head_vocab(self._head, self.config.reference.head)
        return self._head

    def _check_head_vocab(self, head: Any, path: Path) -> None:
        vocab = int(head.weight.shape[0])
        if vocab < self.suite.vocab_size:
            from harness.errors import VerificationError

            raise VerificationError(path, "head vocab smaller than the suite's tokenizer vocab", self.suite.vocab_size, vocab)

    def candidate_head(self, cand: CandidateConfig) -> Any:
        if cand.head is None:
            return None
        if cand.name not in self._cand_heads:
            from harness.head import load_head

            head = load_head(cand.head)
            self._check_head_vocab(head, cand.head)
            self._cand_heads[cand.name] = head
        return self._cand_heads[cand.name]

    @property
    def reference(self) -> Any:
        """The verified reference store; captured from the reference model when missing."""
        if self._reference is None:
            from harness.store import CaptureStore

            ref = self.config.reference
            if not (ref.store / "capture.json").exists():
                if ref.model is None:
                    raise FidelityError(
                        f"{ref.store}: reference capture store is missing and no reference.model is "
                        f"configured in {self.config.path} to capture it from"
                    )
                from harness.engines.transformers import capture

                capture(ref.model, self.suite, ref.store, device=self.device, progress=self.progress)
            self._reference = CaptureStore.open(ref.store, self.suite, verify=True)
        return self._reference

    def shard_indices(self, shard: int) -> list[int]:
        return list(self.suite.shard_indices(shard))

    def candidate_store(self, cand: CandidateConfig, shard: int) -> Any:
        """The candidate's capture covering ``shard``: replayed, or captured live into the cache."""
        from harness.store import CaptureStore

        if cand.store is not None:
            if cand.name not in self._stores:
                self._stores[cand.name] = CaptureStore.open(cand.store, self.suite, verify=True)
            store = self._stores[cand.name]
            missing = set(self.shard_indices(shard)) - set(store.indices)
            if missing:
                raise FidelityError(
                    f"{cand.store}: capture store lacks {len(missing)} context(s) of shard {shard:02d} "
                    f"(first missing: {min(missing)})"
                )
            return store
        return self._capture_live(cand, shard)

    def plan(self, cases: list[tuple[str, int]]) -> None:
        """Declare the cases this process will run, so a live model captures all of its shards at once."""
        for name, shard in cases:
            self._planned.setdefault(name, set()).add(shard)

    def live_store_path(self, cand: CandidateConfig) -> Path:
        """Cache folder of a live candidate's capture, keyed by its identity (by content)."""
        from harness.identity import identity_key, model_identity

        assert cand.model is not None
        if cand.engine == "llamacpp":
            from harness.engines.llamacpp import gguf_identity

            ident = gguf_identity(cand.model)
        else:
            ident = model_identity(cand.model)
        key = identity_key({"model": ident, "engine": cand.engine, "device": self.device})
        return self.config.cache_dir / "captures" / f"{cand.name}-{key[:16]}"

    def _capture_live(self, cand: CandidateConfig, shard: int) -> Any:
        """Capture a live candidate into its cache store; the model is loaded once for all planned shards."""
        from harness.store import CaptureStore

        assert cand.model is not None
        if cand.engine not in ("transformers", "llamacpp"):
            raise FidelityError(
                f"{self.config.path}: engine {cand.engine!r} of candidate {cand.name!r} is not available in this build"
            )
        out = self.live_store_path(cand)
        if (out / "capture.json").exists():
            store = CaptureStore.open(out, self.suite, verify=True)
            if not store.missing(self.shard_indices(shard)):
                return store
        shards = sorted(self._planned.get(cand.name, set()) | {shard})
        if cand.engine == "llamacpp":
            from harness.engines.llamacpp import capture as capture_gguf

            return capture_gguf(cand.model, self.suite, out, shards=shards, progress=self.progress)
        from harness.engines.transformers import capture

        return capture(cand.model, self.suite, out, shards=shards, device=self.device, progress=self.progress)

    # ------------------------------------------------------------------ scoring
    def positions(self, cand: CandidateConfig, shard: int) -> "ShardPositions":
        """The scored positions of a candidate x shard, scored once per process and then cached
        (windows, tails and paired comparisons re-use them; no recapture, no rescoring)."""
        key = (cand.name, shard)
        if key not in self._positions:
            self._positions[key] = shard_positions(
                suite=self.suite, shard=shard, reference=self.reference, candidate=self.candidate_store(cand, shard),
                head=self.head, cand_head=self.candidate_head(cand), device=self.device,
            )
        return self._positions[key]

    def score(self, cand: CandidateConfig, shard: int, *, n_boot: int | None = None) -> ScoredShard:
        """Score one candidate x shard and build its report."""
        t0 = time.perf_counter()
        ref_store = self.reference
        cand_store = self.candidate_store(cand, shard)
        report = score_shard(
            positions=self.positions(cand, shard),
            suite=self.suite,
            shard=shard,
            reference=ref_store,
            candidate=cand_store,
            head=self.head,
            cand_head=self.candidate_head(cand),
            reference_name=self.config.reference.name,
            candidate_name=cand.name,
            candidate_meta={"size_bytes": candidate_size_bytes(cand), "tags": list(cand.tags)},
            score_from=self.score_from,
            n_boot=n_boot or self.config.n_boot,
            device=self.device,
        )
        report.timing["total_s"] = time.perf_counter() - t0
        return ScoredShard(cand.name, shard, report, headline_of(report.metrics), candidate_size_bytes(cand))


def score_shard(
    *,
    suite: Any,
    shard: int,
    reference: Any,
    candidate: Any,
    head: Any,
    cand_head: Any = None,
    reference_name: str = "reference",
    candidate_name: str,
    candidate_meta: dict[str, Any] | None = None,
    score_from: int = 0,
    n_boot: int = 10_000,
    device: str = "cpu",
    positions: "ShardPositions | None" = None,
) -> Any:
    """Score one shard of verified inputs and build its :class:`~harness.report.ShardReport`.

    ``positions`` (from :func:`shard_positions`) reuses already scored positions: the same
    capture summarized under another window needs no rescoring.

    ``reference`` and ``candidate`` are opened :class:`~harness.store.CaptureStore` objects of
    the same kind: hidden-state stores go through ``head`` (and ``cand_head`` for the
    candidate when given); logits stores are scored in logits mode (no head).
    """
    from harness.metrics import summarize
    from harness.report import ShardReport, make_comparability

    pos = positions if positions is not None else shard_positions(
        suite=suite, shard=shard, reference=reference, candidate=candidate, head=head, cand_head=cand_head, device=device
    )
    mode, head_sha, cand_head_sha = pos.mode, pos.head_sha256, pos.cand_head_sha256
    t2 = time.perf_counter()
    metrics = summarize(pos.scores, pos.context_index, pos.row, pos.labels, score_from=score_from, n_boot=n_boot)
    t3 = time.perf_counter()
    comparability = make_comparability(
        suite_token_sha256=suite.suite_token_sha256,
        shard_index=shard,
        shard_sha256=suite.shard(shard).sha256,
        score_from=score_from,
        reference={"name": reference_name, "identity": reference.identity},
        candidate={"name": candidate_name, "identity": candidate.identity, **(candidate_meta or {})},
        head_sha256=head_sha,
        cand_head_sha256=cand_head_sha,
        engine={
            "reference": reference.manifest.get("engine"),
            "candidate": candidate.manifest.get("engine"),
            "candidate_runtime": candidate.manifest.get("runtime"),
        },
        scorer={**SCORER_SETTINGS, "mode": mode},
    )
    return ShardReport(
        candidate=candidate_name,
        comparability=comparability,
        metrics=metrics,
        timing={"load_s": pos.load_s, "score_s": pos.score_s, "metrics_s": t3 - t2, "device": device},
    )


@dataclass
class ShardPositions:
    """The scored positions of one candidate x shard, before any window or statistic."""

    scores: Any  # harness.scorer.PositionScores
    context_index: np.ndarray
    row: np.ndarray
    labels: list[Any]  # harness.metrics.ContextLabel per context of the shard
    mode: str
    head_sha256: str | None
    cand_head_sha256: str | None
    load_s: float = 0.0
    score_s: float = 0.0


def shard_positions(
    *, suite: Any, shard: int, reference: Any, candidate: Any, head: Any, cand_head: Any = None, device: str = "cpu"
) -> ShardPositions:
    """Load one shard of both captures and score every position (no window, no statistics)."""
    import torch

    from harness.metrics import ContextLabel
    from harness.scorer import score_hidden, score_logits

    # a logits-only candidate (e.g. llama.cpp) against a hidden-state reference: the reference's
    # logits are formed through the shared head (fp32, like the scorer) and both are scored in logits mode
    mixed = reference.kind == "hidden_states" and candidate.kind == "logits"
    if reference.kind != candidate.kind and not mixed:
        raise FidelityError(
            f"{candidate.root}: store kind {candidate.kind!r} cannot be scored against a {reference.kind!r} "
            f"reference ({reference.root})"
        )
    t0 = time.perf_counter()
    indices = list(suite.shard_indices(shard))
    rows_per = suite.n_ctx - 1
    targets = torch.from_numpy(suite.tokens[indices, 1:].astype(np.int64).reshape(-1))
    from harness.streaming import STREAM_MIN_BYTES, score_hidden_streaming

    if reference.kind != "logits" and not mixed and 2 * len(indices) * rows_per * reference.width * 2 > STREAM_MIN_BYTES:
        # large shard: prefetch the next contexts while the current ones are scored (bounded memory)
        scores, wait_s, score_s = score_hidden_streaming(
            reference, candidate, indices, targets, head.weight,
            None if cand_head is None else cand_head.weight, device=device,
        )
        mode, head_sha = "hidden_states", head.sha256
        cand_head_sha = None if cand_head is None else cand_head.sha256
        context_index = np.repeat(np.asarray(indices, dtype=np.int64), rows_per)
        row = np.tile(np.arange(rows_per, dtype=np.int64), len(indices))
        labels = [ContextLabel(index=c.index, source_cluster=c.source_cluster, stratum=c.stratum)
                  for c in (suite.contexts[i] for i in indices)]
        return ShardPositions(scores, context_index, row, labels, mode, head_sha, cand_head_sha, wait_s, score_s)
    ref = reference.load_rows(indices)
    cnd = candidate.load_rows(indices)
    t1 = time.perf_counter()
    if mixed:
        from harness.scorer import gemm_operand, logits_gemm

        with torch.inference_mode():
            w = gemm_operand(head.weight, torch.device("cpu"))
            ref = logits_gemm(ref, w, torch.empty(ref.shape[0], w.shape[0], dtype=torch.float32))
        scores = score_logits(ref, cnd, targets)
        mode, head_sha, cand_head_sha = "logits (reference through head)", head.sha256, None
    elif reference.kind == "logits":
        scores = score_logits(ref, cnd, targets)
        mode, head_sha, cand_head_sha = "logits", None, None
    else:
        scores = score_hidden(
            ref, cnd, head.weight, targets,
            cand_head=None if cand_head is None else cand_head.weight,
            device=device,
        )
        mode, head_sha = "hidden_states", head.sha256
        cand_head_sha = None if cand_head is None else cand_head.sha256
    t2 = time.perf_counter()
    context_index = np.repeat(np.asarray(indices, dtype=np.int64), rows_per)
    row = np.tile(np.arange(rows_per, dtype=np.int64), len(indices))
    labels = [ContextLabel(index=c.index, source_cluster=c.source_cluster, stratum=c.stratum)
              for c in (suite.contexts[i] for i in indices)]
    return ShardPositions(scores, context_index, row, labels, mode, head_sha, cand_head_sha, t1 - t0, t2 - t1)


#: Scorer settings that decide the numbers (tiling does not, so it is not recorded here).
SCORER_SETTINGS = {"method": "single-pass-tiled", "gemm": "head dtype, fp32 accumulate", "softmax_dtype": "float32"}


def report_shard(report: Any) -> int:
    """The shard number of a :class:`~harness.report.ShardReport`."""
    return int(report.comparability["shard"]["index"])


def headline_of(metrics: dict[str, Any]) -> Headline:
    """The numbers baselines gate on, taken from a metrics dict."""
    kld = metrics["kld"]
    return Headline(
        mean_kld=float(kld["mean"]),
        ci_low=float(kld["ci95"][0]),
        ci_high=float(kld["ci95"][1]),
        p99=float(kld["p99"]),
        top1=float(metrics["top1"]["agreement"]),
    )
