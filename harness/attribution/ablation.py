"""Weight-swap ablations on one model in memory: capture, score, per-context KLD sums.

Reasoning: docs/diagnostics.md §"Weight-swap ablations".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.attribution.formats import SUPPORTED, candidate_format, compressed_tensors_weights, torchao_weights
from harness.attribution.groups import layer_index, split_unit
from harness.engines.transformers import head_inputs, load_model, parse_dtype
from harness.errors import FidelityError, VerificationError
from harness.scoring.scorer import score_hidden

#: Contexts per forward pass.
BATCH = 16


@dataclass
class ContextKLD:
    """Per-context sums of one variant, in the order of ``AblationModels.indices``."""

    sum_kld: np.ndarray  # float64 [n_contexts]
    top1: np.ndarray  # int64 [n_contexts], positions whose argmax agrees with the reference


@dataclass
class AblationModels:
    """One model in memory plus both weight sets of every differing parameter."""

    model: torch.nn.Module
    ref_values: dict[str, torch.Tensor]
    cand_values: dict[str, torch.Tensor]
    params: list[str]  # differing parameters, in the model's order
    device: torch.device
    reference_dir: Path
    candidate_dir: Path
    _live: dict[str, str] = field(default_factory=dict)  # param -> "ref" | "cand" currently in the model

    def set_variant(self, restored: Iterable[str]) -> None:
        """Put the reference's values into ``restored`` units and the candidate's into the rest.

        A unit is a differing parameter, or one expert's slice ``p[e]`` of a fused experts tensor
        (:func:`harness.attribution.groups.split_unit`): the block ``p[e]`` takes the reference's
        values, the other experts of ``p`` keep the candidate's.
        """
        whole: set[str] = set()
        rows: dict[str, set[int]] = {}
        known = set(self.params)
        for unit in restored:
            p, e = split_unit(unit)
            if p not in known or (e is not None and not (self.ref_values[p].ndim == 3 and e < self.ref_values[p].shape[0])):
                raise FidelityError(f"not a differing parameter (or an expert slice of one): {unit}")
            if e is None:
                whole.add(p)
            else:
                rows.setdefault(p, set()).add(e)
        named = dict(self.model.named_parameters())
        with torch.no_grad():
            for p in self.params:
                picked = sorted(rows.get(p, ()))
                full = p in whole or len(picked) == (self.ref_values[p].shape[0] if picked else -1)
                side = "ref" if full else "cand" if not picked else "ref rows " + ",".join(map(str, picked))
                if self._live.get(p) == side:
                    continue
                if side in ("ref", "cand"):
                    named[p].copy_((self.ref_values if side == "ref" else self.cand_values)[p])
                else:
                    mixed = self.cand_values[p].clone()
                    mixed[picked] = self.ref_values[p][picked]
                    named[p].copy_(mixed)
                self._live[p] = side

    def head_weight(self) -> torch.Tensor:
        head = self.model.get_output_embeddings()  # type: ignore[operator]
        weight: torch.Tensor = head.weight.detach()
        return weight


def _architecture(path: Path) -> dict[str, Any]:
    import json

    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise VerificationError(path / "config.json", "model config", "readable JSON", repr(exc)) from None
    keys = ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "head_dim", "tie_word_embeddings")
    return {k: cfg.get(k) for k in keys}


def load_models(reference_dir: str | Path, candidate_dir: str | Path, *, device: str = "cpu",
                dtype: str = "float32") -> AblationModels:
    """Load the candidate (kept in memory) and the reference's weights; verify they share an architecture."""
    ref_dir, cand_dir = Path(reference_dir), Path(candidate_dir)
    a_ref, a_cand = _architecture(ref_dir), _architecture(cand_dir)
    if a_ref != a_cand:
        diff = {k: (a_ref[k], a_cand[k]) for k in a_ref if a_ref[k] != a_cand[k]}
        raise VerificationError(cand_dir / "config.json", "architecture differs from the reference's",
                                {k: v[0] for k, v in diff.items()}, {k: v[1] for k, v in diff.items()})

    tdtype = parse_dtype(dtype)
    fmt = candidate_format(cand_dir)  # refuses formats whose effective weights it cannot form, before loading
    ref_model = load_model(ref_dir, device="cpu", dtype="bfloat16")
    ref_params = {k: v.detach() for k, v in ref_model.named_parameters()}
    if fmt in SUPPORTED:
        # the decompressed effective weights go into the reference's own (plain) modules
        weights = compressed_tensors_weights if fmt == "compressed-tensors" else torchao_weights
        cand_params = weights(cand_dir, set(ref_params))
        model = ref_model
    else:
        model = load_model(cand_dir, device="cpu", dtype="bfloat16")
        cand_params = dict(model.named_parameters())
    if set(ref_params) != set(cand_params):
        only_ref = sorted(set(ref_params) - set(cand_params))[:3]
        only_cand = sorted(set(cand_params) - set(ref_params))[:3]
        raise VerificationError(cand_dir, "parameters differ from the reference's",
                                f"the reference's names (missing here: {only_ref})", f"extra: {only_cand}")
    params = []
    ref_values: dict[str, torch.Tensor] = {}
    cand_values: dict[str, torch.Tensor] = {}
    dev = torch.device(device)
    for name, p in cand_params.items():
        r = ref_params[name]
        if tuple(r.shape) != tuple(p.shape):
            raise VerificationError(cand_dir, f"shape of {name}", tuple(r.shape), tuple(p.shape))
        if not p.is_floating_point():
            raise VerificationError(cand_dir, f"dtype of {name}", "a floating-point (decompressed) weight", p.dtype,
                                    "load compressed checkpoints decompressed")
        if not torch.equal(r, p.detach()):
            params.append(name)
            ref_values[name] = r.to(dev, tdtype).clone()
            cand_values[name] = p.detach().to(dev, tdtype).clone()
    del ref_model
    model = model.to(dev, tdtype).eval()
    out = AblationModels(model, ref_values, cand_values, params, dev, ref_dir, cand_dir)
    # what the module in memory holds now: the candidate's values, or the reference's when it is the container
    out._live = {p: "ref" if fmt in SUPPORTED else "cand" for p in params}
    out.set_variant(())
    return out


def capture(models: AblationModels, tokens: np.ndarray, batch: int = BATCH) -> torch.Tensor:
    """LM-head inputs ``[n_contexts * (n_ctx - 1), hidden]`` of the model as it is now (rows 0 .. n_ctx-2)."""
    parts = []
    for i in range(0, len(tokens), batch):
        ids = torch.as_tensor(np.asarray(tokens[i : i + batch], dtype=np.int64), device=models.device)
        h = head_inputs(models.model, ids)[:, :-1]
        parts.append(h.reshape(-1, h.shape[-1]))
    return torch.cat(parts)


def routing_counts(models: AblationModels, tokens: np.ndarray, batch: int = BATCH) -> dict[int, np.ndarray]:
    """Per layer, how often each routed expert is among its router's top-k picks over the scored positions
    (rows 0 .. n_ctx-2 of every context) of the model as it is now; empty for a model without routers.

    A router is a module ``layers.<i>.mlp.gate`` whose output is ``(logits, weights, indices)`` (the
    Qwen-MoE families' top-k router); the counts are of ``indices``.
    """
    counts: dict[int, np.ndarray] = {}
    handles = []
    n_rows = tokens.shape[1]

    def hook(layer: int) -> Any:
        def grab(module: torch.nn.Module, _args: tuple[Any, ...], out: Any) -> None:
            idx = out[2].reshape(-1, n_rows, out[2].shape[-1])[:, :-1].reshape(-1)
            n = int(getattr(module, "num_experts", 0)) or int(out[0].shape[-1])
            counts[layer] = counts.get(layer, np.zeros(n, np.int64)) + np.bincount(idx.cpu().numpy(), minlength=n)
        return grab

    for name, module in models.model.named_modules():
        layer = layer_index(name)
        if layer is not None and name.endswith(".mlp.gate") and hasattr(module, "top_k"):
            handles.append(module.register_forward_hook(hook(layer)))
    if handles:
        try:
            capture(models, tokens, batch)
        finally:
            for h in handles:
                h.remove()
    return counts


@dataclass
class ReferenceCapture:
    """The reference variant's capture and head, shared by every scored variant."""

    hidden: torch.Tensor
    head: torch.Tensor
    targets: torch.Tensor
    n_contexts: int
    rows: int


def capture_reference(models: AblationModels, tokens: np.ndarray) -> ReferenceCapture:
    """Restore every differing parameter and capture the reference."""
    models.set_variant(models.params)
    hidden = capture(models, tokens)
    targets = torch.from_numpy(np.asarray(tokens[:, 1:], dtype=np.int64).reshape(-1))
    return ReferenceCapture(hidden, models.head_weight().clone(), targets, len(tokens), tokens.shape[1] - 1)


def score_variant(models: AblationModels, ref: ReferenceCapture, tokens: np.ndarray, restored: Sequence[str]) -> ContextKLD:
    """Set the variant, capture it and score it against the reference: per-context KLD sums."""
    models.set_variant(restored)
    hidden = capture(models, tokens)
    head = models.head_weight()
    cand_head = None if torch.equal(head, ref.head) else head.clone()
    s = score_hidden(ref.hidden, hidden, ref.head, ref.targets, cand_head=cand_head, device=models.device)
    kld = np.asarray(s.kld, dtype=np.float64).reshape(ref.n_contexts, ref.rows)
    top1 = np.asarray(s.top1).reshape(ref.n_contexts, ref.rows)
    return ContextKLD(kld.sum(axis=1), top1.sum(axis=1).astype(np.int64))
