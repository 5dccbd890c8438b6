"""Identity at every join: the one verification that ``fidelity replay`` and the pytest session
both run before a single position is scored (docs/design.md, section 4).

Reasoning: docs/design.md §"Identity at every join".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.capture.store import width_field
from harness.engines.identity import model_identity as identify
from harness.errors import VerificationError
from harness.inputs.head import sidecar_path
from harness.io.jsonio import JSONObject

if TYPE_CHECKING:
    import numpy as np

    from harness.capture.store import CaptureStore
    from harness.inputs.head import HeadTensor
    from harness.inputs.suite import Suite

#: Identity fields that are labels, not content: two folders with the same bytes are one model.
LABEL_FIELDS = ("name",)


def content_identity(identity: JSONObject) -> JSONObject:
    """An identity without its label fields (what two copies of one model share)."""
    return {k: v for k, v in identity.items() if k not in LABEL_FIELDS}


def describe(identity: JSONObject) -> str:
    """A short, human-readable rendering of an identity for messages."""
    parts = []
    if "name" in identity:
        parts.append(f"name {identity['name']!r}")
    if "config_sha256" in identity:
        parts.append(f"config {str(identity['config_sha256'])[:12]}")
    weights = identity.get("weights")
    if isinstance(weights, dict):
        parts.append("weights " + ",".join(f"{k}:{str(v)[:12]}" for k, v in sorted(weights.items())))
    if "sha256" in identity:
        parts.append(f"sha256 {str(identity['sha256'])[:12]}")
    return "{" + "; ".join(parts) + "}" if parts else repr(identity)


def _manifest(store: CaptureStore) -> Path:
    return store.root / "capture.json"


def _comparable(identity: JSONObject) -> bool:
    """Identities by content of a model folder (config and weight hashes) can be compared."""
    return "config_sha256" in identity and isinstance(identity.get("weights"), dict)


def check_reference_identity(reference: CaptureStore, *, reference_model: Path | None = None,
                             model_identity: JSONObject | None = None, head: HeadTensor | None = None) -> None:
    """The reference store's model is the configured reference model and the head's source model."""
    found = reference.identity
    if model_identity is None and reference_model is not None and Path(reference_model).is_dir():
        model_identity = identify(reference_model)
    if model_identity is not None and content_identity(model_identity) != content_identity(found):
        raise VerificationError(
            _manifest(reference), f"model (the configured reference model {reference_model})",
            describe(model_identity), describe(found), "this store was captured from another model")
    if head is not None and reference.kind == "hidden_states":
        if head.source_model is None:
            raise VerificationError(sidecar_path(head.path), "source_model (the model the shared head was exported from)",
                                    "recorded by `fidelity export-head`", "none (sidecar missing or without source_model)",
                                    "without it the head cannot be tied to the reference store")
        source = head.source_model
        if _comparable(source) and _comparable(found) and content_identity(source) != content_identity(found):
            raise VerificationError(
                _manifest(reference), f"model (the source model of the head {head.path})",
                describe(source), describe(found), "the reference store and the shared head come from different models")


def check_not_self(reference: CaptureStore, candidate: CaptureStore) -> None:
    """A candidate that is the reference's own model is a self-check, not a candidate."""
    ref, cand = reference.identity, candidate.identity
    if content_identity(ref) == content_identity(cand) and reference.manifest.get("engine") == candidate.manifest.get("engine"):
        raise VerificationError(
            _manifest(candidate), "candidate model", "a model other than the reference", f"the reference's own model {describe(cand)}",
            "a candidate equal to the reference is a self-check (KLD 0 by construction), never a passing candidate")


def _check_head_vocab(head: HeadTensor, suite: Suite) -> None:
    if head.vocab_size < suite.vocab_size:
        raise VerificationError(head.path, "head vocab_size (>= the suite's tokenizer vocab)", f">= {suite.vocab_size}", head.vocab_size)


def check_widths(suite: Suite, reference: CaptureStore, candidate: CaptureStore, head: HeadTensor | None,
                 cand_head: HeadTensor | None = None) -> None:
    """Every width and vocabulary at the scorer's joins agrees (docs/design.md §"Identity at every join")."""
    rk, ck = reference.kind, candidate.kind
    if rk == "logits" and ck == "hidden_states":
        # the candidate's logits are formed through its own head, else the shared head
        h = cand_head or head
        if h is None:
            raise VerificationError(_manifest(candidate), "head (a hidden-state candidate against a logits reference)",
                                    "the shared head or the candidate's own head", "none given")
        if h.vocab_size != reference.width:
            raise VerificationError(h.path, f"head vocab_size (the width of the logits reference {_manifest(reference)})",
                                    reference.width, h.vocab_size)
        if cand_head is None and h.hidden_size != candidate.width:
            raise VerificationError(h.path, f"head hidden_size (the width of {_manifest(candidate)})", candidate.width, h.hidden_size)
    if rk == "hidden_states":
        if head is None:
            raise VerificationError(_manifest(reference), "shared head", "a head for a hidden-state reference", "none given")
        _check_head_vocab(head, suite)
        if head.hidden_size != reference.width:
            raise VerificationError(head.path, f"head hidden_size (the width of {_manifest(reference)})", reference.width, head.hidden_size)
    if cand_head is not None:
        _check_head_vocab(cand_head, suite)
        if ck != "hidden_states":
            raise VerificationError(cand_head.path, "candidate head", f"only for a hidden-state candidate ({_manifest(candidate)} is {ck})", "a head")
        if cand_head.hidden_size != candidate.width:
            raise VerificationError(cand_head.path, f"candidate head hidden_size (the width of {_manifest(candidate)})",
                                    candidate.width, cand_head.hidden_size)
        if head is not None and cand_head.vocab_size != head.vocab_size:
            raise VerificationError(cand_head.path, f"candidate head vocab_size (the shared head {head.path})",
                                    head.vocab_size, cand_head.vocab_size)
    elif ck == "hidden_states" and rk == "hidden_states" and candidate.width != reference.width:
        raise VerificationError(_manifest(candidate), f"{width_field(ck)} (same as the reference store)",
                                reference.width, candidate.width)
    if ck == "logits":
        if rk == "hidden_states":
            assert head is not None
            if candidate.width != head.vocab_size:
                raise VerificationError(_manifest(candidate), f"vocab_size (the shared head {head.path})", head.vocab_size, candidate.width)
        elif candidate.width != reference.width:
            raise VerificationError(_manifest(candidate), "vocab_size (same as the reference store)",
                                    reference.width, candidate.width)
        if candidate.width < suite.vocab_size:
            raise VerificationError(_manifest(candidate), "vocab_size (>= the suite's tokenizer vocab)", f">= {suite.vocab_size}", candidate.width)
    if rk == "logits" and reference.width < suite.vocab_size:
        raise VerificationError(_manifest(reference), "vocab_size (>= the suite's tokenizer vocab)", f">= {suite.vocab_size}", reference.width)


def first_scored_row(store: CaptureStore) -> int:
    """The first row a store holds real values for (0, or an imported ``.kld``'s ``scored_from_row``)."""
    value = store.identity.get("scored_from_row", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise VerificationError(_manifest(store), "model.scored_from_row", "an integer >= 0", value)
    return value


def check_window(suite: Suite, stores: Sequence[CaptureStore], score_from: int, where: str = "--window (score_from)") -> None:
    """``score_from`` leaves a row to score and never reaches into rows a store does not hold."""
    if isinstance(score_from, bool) or not isinstance(score_from, int) or not 0 <= score_from < suite.n_ctx - 1:
        raise VerificationError(suite.root / "suite.json", where, f"0..{suite.n_ctx - 2} (n_ctx {suite.n_ctx})", score_from)
    for store in stores:
        first = first_scored_row(store)
        if score_from < first:
            raise VerificationError(
                _manifest(store), f"{where} of a store holding rows {first}..{suite.n_ctx - 2} only", f">= {first}", score_from,
                f"rows before {first} were never computed (an imported .kld file); score with --window {first}")


def check_contexts(stores: Sequence[CaptureStore], suite: Suite, shards: Sequence[int]) -> None:
    """Every store holds every context of every selected shard."""
    wanted = [i for k in shards for i in suite.shard_indices(k)]
    for store in stores:
        missing = store.missing(wanted)
        if missing:
            raise VerificationError(
                _manifest(store), f"contexts of shard(s) {','.join(map(str, shards))}", "all captured",
                f"{len(missing)} missing (first: {missing[0]})", "capture them with `fidelity capture --shards ...`")


def verify_joins(*, suite: Suite, reference: CaptureStore, candidate: CaptureStore, head: HeadTensor | None,
                 cand_head: HeadTensor | None = None, score_from: int = 0, shards: Sequence[int] | None = None,
                 reference_model: Path | None = None, reference_identity: JSONObject | None = None) -> None:
    """Run every join check of docs/design.md §"Identity at every join" (replay and the pytest session both call this)."""
    check_window(suite, [reference, candidate], score_from)
    check_reference_identity(reference, reference_model=reference_model, model_identity=reference_identity, head=head)
    check_widths(suite, reference, candidate, head, cand_head)
    check_not_self(reference, candidate)
    if shards is not None:
        check_contexts([reference, candidate], suite, shards)


def check_scores_finite(kld: np.ndarray, context_index: np.ndarray, row: np.ndarray, reference: CaptureStore, candidate: CaptureStore,
                        head: HeadTensor | None, cand_head: HeadTensor | None = None) -> None:
    """Refuse non-finite per-position scores, naming the context file whose values overflowed."""
    import numpy as np

    bad = np.flatnonzero(~np.isfinite(np.asarray(kld)))
    if bad.size == 0:
        return
    i = int(bad[0])
    ctx, r = int(context_index[i]), int(row[i])
    culprit = _overflowing_side(ctx, r, reference, candidate, head, cand_head)
    store = culprit or candidate
    path = store.root / store.files[ctx] if ctx in store.files else _manifest(store)
    raise VerificationError(
        path, f"values of context {ctx}, row {r}", "values whose fp32 logits are finite",
        f"{bad.size} position(s) with non-finite scores", "a finite but huge value overflows the logits")


def _overflowing_side(ctx: int, r: int, reference: CaptureStore, candidate: CaptureStore,
                      head: HeadTensor | None, cand_head: HeadTensor | None) -> CaptureStore | None:
    """The store whose row gives non-finite fp32 logits (or non-finite values itself)."""
    import torch

    for store, h in ((candidate, cand_head or head), (reference, head)):
        x = store.load(ctx)[r : r + 1].to(torch.float32)
        if store.kind == "hidden_states" and h is not None:
            x = x @ h.weight.to(torch.float32).T
        if not bool(torch.isfinite(x).all()) or not bool(torch.isfinite(torch.logsumexp(x, dim=-1)).all()):
            return store
    return None
