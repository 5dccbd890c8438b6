"""Which candidate checkpoints ``fidelity attribute`` can take apart, and their effective weights.

Reasoning: docs/diagnostics.md §"Checkpoint formats".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from harness.engines.transformers import check_loading_info, load_model
from harness.errors import FidelityError, VerificationError

__all__ = ["CT_AUX_SUFFIXES", "SUPPORTED", "candidate_format", "compressed_tensors_weights", "torchao_weights"]

#: The quantized formats whose effective weights this module forms (besides plain folders).
SUPPORTED = ("compressed-tensors", "torchao")

#: Parameters compressed-tensors keeps beside a decompressed ``weight`` (quantization metadata, not weights).
CT_AUX_SUFFIXES = ("weight_scale", "weight_zero_point", "weight_global_scale", "weight_shape", "weight_g_idx",
                   "input_global_scale")


def _quant_config(model_dir: Path) -> dict[str, Any] | None:
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise VerificationError(model_dir / "config.json", "model config", "readable JSON", repr(exc)) from None
    qc = cfg.get("quantization_config")
    return qc if isinstance(qc, dict) else None


def candidate_format(model_dir: Path) -> str:
    """``"plain"`` or ``"compressed-tensors"``; any other quantized format is a FidelityError naming it."""
    qc = _quant_config(model_dir)
    if qc is None:
        return "plain"
    method = qc.get("quant_method")
    if method == "torchao":
        types = sorted({str(v.get("_type")) for v in (qc.get("quant_type") or {}).values() if isinstance(v, dict)})
        if not types or any("Activation" in t for t in types):
            raise FidelityError(
                f"{model_dir / 'config.json'}: fidelity attribute refuses this torchao configuration "
                f"({', '.join(types) or 'no quant_type'}): only weight-only configurations can be swapped weight by weight")
        return "torchao"
    if method != "compressed-tensors":
        raise FidelityError(
            f"{model_dir / 'config.json'}: fidelity attribute cannot take apart quant_method {method!r}: it swaps each "
            "module's dense effective weight, and decompresses only compressed-tensors, torchao weight-only and plain folders "
            "(export the model as compressed-tensors, or dequantize it to a plain folder)")
    quantized_activations = []
    for name, group in sorted((qc.get("config_groups") or {}).items()):
        for key in ("input_activations", "output_activations"):
            if isinstance(group, dict) and group.get(key):
                a = group[key]
                quantized_activations.append(f"{name}.{key} ({a.get('type')} {a.get('num_bits')}-bit"
                                             f"{', dynamic' if a.get('dynamic') else ''})")
    if qc.get("kv_cache_scheme"):
        quantized_activations.append("kv_cache_scheme")
    if quantized_activations:
        raise FidelityError(
            f"{model_dir / 'config.json'}: fidelity attribute refuses this compressed-tensors scheme: it quantizes "
            f"activations too ({', '.join(quantized_activations)}), which a weight swap cannot reproduce")
    return "compressed-tensors"


def compressed_tensors_weights(model_dir: Path, names: set[str]) -> dict[str, torch.Tensor]:
    """The decompressed (effective) weights of a compressed-tensors checkpoint by parameter name (bf16).

    Every one of ``names`` (the reference's parameters) must be there; any other parameter must be a
    quantization parameter (:data:`CT_AUX_SUFFIXES`)."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    try:
        result: Any = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.bfloat16, use_safetensors=True, output_loading_info=True,
            quantization_config=CompressedTensorsConfig(dequantize=True))
    except (ImportError, OSError, ValueError) as e:
        raise FidelityError(f"{model_dir}: transformers could not load the compressed-tensors checkpoint decompressed ({e})") from None
    model, info = result
    check_loading_info(model_dir, info)
    params = {k: v.detach() for k, v in model.named_parameters()}
    params.update({k: v.detach() for k, v in model.named_buffers() if k in names})
    missing = sorted(names - set(params))
    if missing:
        raise VerificationError(model_dir, "decompressed parameters", f"the reference's names (missing here: {missing[:3]})",
                                "fewer")
    other = sorted(k for k in set(params) - names if k.split(".")[-1] not in CT_AUX_SUFFIXES)
    if other:
        raise VerificationError(model_dir, "decompressed parameters", "the reference's names and quantization parameters",
                                f"extra: {other[:3]}")
    return {k: params[k] for k in names}


def torchao_weights(model_dir: Path, names: set[str]) -> dict[str, torch.Tensor]:
    """The effective weights of a torchao checkpoint by parameter name (bf16): each quantized weight's
    ``dequantize()``, every other parameter as stored. The names must be the reference's."""
    model = load_model(model_dir, device="cpu", dtype="bfloat16")
    params = dict(model.named_parameters())
    if set(params) != names:
        raise VerificationError(model_dir, "parameters differ from the reference's",
                                f"the reference's names (missing here: {sorted(names - set(params))[:3]})",
                                f"extra: {sorted(set(params) - names)[:3]}")
    out: dict[str, torch.Tensor] = {}
    for name, p in params.items():
        t = p.detach()
        if type(t) is not torch.Tensor:  # a torchao tensor subclass
            deq = getattr(t, "dequantize", None)
            if deq is None:
                raise VerificationError(model_dir, f"weight {name}", "a tensor or a torchao tensor with dequantize()",
                                        type(t).__name__)
            t = deq()
        if type(t) is not torch.Tensor:
            raise VerificationError(model_dir, f"dequantized weight {name}", "a dense tensor", type(t).__name__)
        out[name] = t.to(torch.bfloat16)
    return out
