"""Bridges between the harness's files and llama.cpp's ``.kld`` file.

Reasoning: docs/llamacpp.md §"Bridges to llama.cpp's file".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness import PROTOCOL_VERSION
from harness.capture.store import CaptureStore, StoreWriter
from harness.engines import identity
from harness.errors import FidelityError, VerificationError
from harness.inputs.suite import SCHEMA, SUITE_JSON, TOKENS_FILE, ContextInfo, load_suite, manifest_sha256, split_shards
from harness.io.atomic import atomic_write_bytes, atomic_write_json, removed_on_failure
from harness.io.hashing import sha256_file, tokens_sha256
from harness.io.jsonio import read_json
from harness.llamacpp.kld_file import KldFile, first_scored, read_kld, write_kld
from harness.llamacpp.kld_parts import is_parts_manifest, open_parts, parts_sha256
from harness.llamacpp.stats import LlamaPositions, positions_from_kld

if TYPE_CHECKING:
    from harness.inputs.head import HeadTensor
    from harness.inputs.suite import Suite

KLD_ENGINE = {"name": "llama.cpp-kld", "version": "1"}


def store_logits(store: CaptureStore, index: int, head: HeadTensor | None = None, rows: slice | None = None) -> np.ndarray:
    """float32 logits ``[rows, vocab]`` of context ``index`` of a capture store: a logits store as
    stored, a hidden-state store through ``head`` (fp32 logits from bf16 operands, like the scorer)."""
    import torch

    t = store.load(index)
    if rows is not None:
        t = t[rows]
    if store.kind == "logits":
        logits: np.ndarray = t.to(torch.float32).numpy()
        return logits
    if head is None:
        raise FidelityError(f"{store.root}: a hidden-state store needs the shared head (--head) to give logits")
    from harness.scoring.scorer import gemm_operand, logits_gemm

    with torch.inference_mode():
        w = gemm_operand(head.weight, torch.device("cpu"))
        out = torch.empty(t.shape[0], w.shape[0], dtype=torch.float32)
        return logits_gemm(t, w, out).numpy().copy()


def export_kld(suite: Suite, store: CaptureStore, out: str | Path, head: HeadTensor | None = None, indices: Sequence[int] | None = None) -> Path:
    """Write ``store``'s logits over ``suite`` (all contexts, or ``indices``) as a ``.kld`` file."""
    idx = list(range(suite.n_contexts)) if indices is None else list(indices)
    missing = store.missing(idx)
    if missing:
        raise FidelityError(f"{store.root}: {len(missing)} context(s) not captured (first: {missing[0]})")
    vocab = store.width if store.kind == "logits" else int(head.weight.shape[0]) if head is not None else None
    if vocab is None:
        raise FidelityError(f"{store.root}: a hidden-state store needs the shared head (--head)")
    first = first_scored(suite.n_ctx)
    tokens = suite.tokens[idx].astype(np.int64)
    return write_kld(out, tokens, vocab, lambda i: store_logits(store, idx[i], head, slice(first, None)))


def import_kld(path: str | Path, out: str | Path, n_shards: int = 1) -> tuple[Suite, CaptureStore]:
    """A ``.kld`` file -> ``out/suite`` and ``out/reference`` (logits store). Returns (suite, store)."""
    kf = read_kld(path)
    out = Path(out)
    _refuse_other_import(kf, Path(path), out, n_shards)
    with removed_on_failure(out, out / "suite", out / "reference"):  # a refused import leaves nothing it made
        return _import(kf, Path(path), out, n_shards)


def _import(kf: KldFile, path: Path, out: Path, n_shards: int) -> tuple[Suite, CaptureStore]:
    import torch

    suite = suite_from_tokens(kf.tokens, kf.n_vocab, out / "suite", n_shards=n_shards, source=Path(path).name,
                              tokenizer_sha256=f"unknown (from {Path(path).name})")
    ident = {"name": Path(path).name, "format": "llama.cpp .kld", "sha256": kld_sha256(Path(path)),
             "scored_from_row": kf.first, "n_vocab": kf.n_vocab}
    writer = StoreWriter(out / "reference", suite, "logits", kf.n_vocab, "float32", ident, dict(KLD_ENGINE),
                         identity.runtime_identity(), "cpu")
    with writer:
        for i in range(kf.n_chunk):
            if writer.done(i):
                continue
            full = np.zeros((kf.n_ctx - 1, kf.n_vocab), dtype=np.float32)
            full[kf.first :] = kf.log_probs(i)
            writer.write(i, torch.from_numpy(full))
    return suite, CaptureStore.open(out / "reference", suite)


def _refuse_other_import(kf: KldFile, path: Path, out: Path, n_shards: int) -> None:
    """Before anything is written: a folder that already holds another import (another ``.kld``
    file, other tokens or another shard split) is refused; the same import resumes."""
    sj, mf = out / "suite" / "suite.json", out / "reference" / "capture.json"
    if sj.exists():
        doc = read_json(sj)
        want = tokens_sha256(np.ascontiguousarray(kf.tokens, dtype="<u4"))
        if doc.get("suite_token_sha256") != want or doc.get("n_shards") != n_shards:
            raise VerificationError(sj, "existing suite (a store is never overwritten)",
                                    f"the tokens of {path.name} in {n_shards} shard(s) ({want[:12]})",
                                    f"{str(doc.get('suite_token_sha256'))[:12]} in {doc.get('n_shards')} shard(s)",
                                    "import into a new --out folder")
    if mf.exists():
        model = read_json(mf).get("model")
        digest = kld_sha256(Path(path))
        if not isinstance(model, dict) or model.get("sha256") != digest:
            raise VerificationError(mf, "existing reference store (a store is never overwritten)", f"an import of {path.name} ({digest[:12]})",
                                    f"{model.get('name') if isinstance(model, dict) else model!r}", "import into a new --out folder")
    elif out.exists() and (out / "reference").exists() and any((out / "reference").iterdir()):
        raise VerificationError(out / "reference", "folder", "absent or an earlier import of the same file", "a folder without capture.json")


def kld_sha256(path: Path) -> str:
    """sha256 of a ``.kld`` file, or of the file a parts manifest makes up (its parts checked too)."""
    return parts_sha256(open_parts(path)) if is_parts_manifest(path) else sha256_file(path)


def suite_from_tokens(tokens: np.ndarray, vocab: int, out: str | Path, n_shards: int = 1, source: str = "tokens",
                      tokenizer_sha256: str = "unknown") -> Suite:
    """A suite whose contexts are the rows of ``tokens`` (each its own source cluster, stratum ``kld``)."""
    import io
    from dataclasses import asdict

    toks = np.ascontiguousarray(tokens, dtype="<u4")
    n, n_ctx = toks.shape
    if not 1 <= n_shards <= n:
        raise FidelityError(f"n_shards must lie in [1, {n}], found {n_shards}")
    contexts = [ContextInfo(i, f"{source}#chunk{i}", "kld", source, i * n_ctx) for i in range(n)]
    shards = split_shards(toks, n_shards)
    doc: dict[str, Any] = {
        "schema": SCHEMA, "protocol_version": PROTOCOL_VERSION, "n_ctx": int(n_ctx), "n_contexts": int(n),
        "n_shards": n_shards, "seed": 0, "tokenizer": {"sha256": tokenizer_sha256, "vocab_size": int(vocab)},
        "tokens_file": TOKENS_FILE, "tokens_dtype": "<u4", "suite_token_sha256": tokens_sha256(toks),
        "contexts": [asdict(c) for c in contexts], "shards": [asdict(s) for s in shards],
    }
    doc["manifest_sha256"] = manifest_sha256(doc)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.save(buf, toks, allow_pickle=False)
    atomic_write_bytes(out / TOKENS_FILE, buf.getvalue())
    atomic_write_json(out / SUITE_JSON, doc)
    return load_suite(out, verify=True)


def check_tokens(kf: KldFile, suite: Suite) -> None:
    """The ``.kld`` file's chunks must be exactly the suite's contexts."""
    if (kf.n_chunk, kf.n_ctx) != (suite.n_contexts, suite.n_ctx) or not np.array_equal(kf.tokens, suite.tokens.astype(np.int64)):
        raise VerificationError(kf.path, "tokens", f"the {suite.n_contexts} x {suite.n_ctx} contexts of {suite.root}",
                                f"{kf.n_chunk} chunks x {kf.n_ctx} tokens that differ",
                                "the .kld file was written for other tokens")


def llamacpp_positions(kf: KldFile, suite: Suite, candidate: CaptureStore, head: HeadTensor | None = None,
                       indices: Sequence[int] | None = None) -> LlamaPositions:
    """llama.cpp's per-position values of ``candidate`` (capture store) against the ``.kld`` base."""
    check_tokens(kf, suite)
    idx = list(range(kf.n_chunk)) if indices is None else list(indices)
    parts = []
    for i in idx:
        x = store_logits(candidate, i, head, slice(kf.first, None))
        if x.shape[1] != kf.n_vocab:
            raise VerificationError(candidate.root, "candidate logit width", kf.n_vocab, x.shape[1])
        parts.append(positions_from_kld(np.asarray(kf.rows[i]), x, kf.targets(i), kf.n_vocab))
    return LlamaPositions.concat(parts)
