"""The project's own quantized format for a layout search: quantize, the effective weights, bytes, build.

Quantization is symmetric round-to-nearest per group (``fixtures/make_candidates.py``'s ``rtn_sym_group``,
reproduced here in float64 numpy): per group of ``g`` inputs of a row, ``scale = bf16(absmax / (2^(b-1) - 1))``
and ``code = clip(round(w / scale), -2^(b-1), 2^(b-1) - 1) + 2^(b-1)`` (round half to even), so a uniform
layout built here holds the committed candidates' bytes exactly (``tests/test_allocate.py`` checks it on
``int4_g32`` and ``int8``). A mixed layout is one ``quantization.json`` whose top-level ``bits`` / ``group_size``
are the base choice and whose ``layer_schemes`` name every unit quantized otherwise
(:mod:`harness.engines.quant_manifest`).

Reasoning: docs/allocation.md §"The project's format".
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from harness.allocation.choices import ProjectScheme, parse_project
from harness.engines.quant_manifest import CONFIG_FILE, QUANT_FILE, WEIGHTS_FILE, LayerScheme, QuantRecipe
from harness.engines.quant_weights import pack_codes, packed_size
from harness.errors import FidelityError, VerificationError
from harness.io.hashing import sha256_file

METHOD = "rtn_sym_group"
LIBRARY = "harness-rtn"


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float64 -> the nearest bf16 value (ties to even), still float64 (8 significant bits)."""
    _, e = np.frexp(x)
    step = np.exp2(e.astype(np.float64) - 1.0 - 7.0)
    out: np.ndarray = np.where(x == 0, x, np.round(x / step) * step)
    return out


def group_of(scheme: ProjectScheme, in_features: int) -> int:
    g = scheme.group_size or in_features
    if in_features % g:
        raise FidelityError(f"{scheme.name}: group size {g} does not divide the rows of {in_features} inputs")
    return g


def quantize(w: np.ndarray, scheme: ProjectScheme) -> tuple[np.ndarray, np.ndarray]:
    """Codes (uint8 ``[out, in]``) and float64 bf16-valued scales (``[out, in / g]``) of a float64 weight."""
    out_f, in_f = w.shape
    g = group_of(scheme, in_f)
    qmax = (1 << (scheme.bits - 1)) - 1
    grouped = w.reshape(out_f, in_f // g, g)
    scale = bf16_round(np.abs(grouped).max(axis=-1) / qmax)
    safe = np.where(scale == 0, 1.0, scale)
    q = np.clip(np.round(grouped / safe[..., None]), -qmax - 1, qmax)
    return (q + qmax + 1).reshape(out_f, in_f).astype(np.uint8), scale


def effective(w: np.ndarray, scheme: ProjectScheme) -> np.ndarray:
    """The dequantized weight the format's loader gives (float64 product, rounded once to bf16), float32."""
    codes, scale = quantize(w, scheme)
    g = group_of(scheme, w.shape[1])
    vals = (codes.astype(np.float64) - (1 << (scheme.bits - 1))) * np.repeat(scale, g, axis=1)
    return torch.from_numpy(vals).to(torch.float32).to(torch.bfloat16).to(torch.float32).numpy()


def unit_bytes(shape: tuple[int, int], scheme: ProjectScheme) -> int:
    """Stored bytes of one unit: packed codes plus bf16 scales."""
    out_f, in_f = shape
    return packed_size(out_f * in_f, scheme.bits) + 2 * out_f * (in_f // group_of(scheme, in_f))


def source_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the reference checkpoint (``model.safetensors``)."""
    from safetensors import safe_open

    path = Path(model_dir) / WEIGHTS_FILE
    if not path.is_file():
        raise VerificationError(path, "reference weights", "a model.safetensors file", "missing")
    with safe_open(str(path), framework="pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}


def fixed_bytes(source: Mapping[str, torch.Tensor], units: set[str]) -> int:
    """Stored bytes of every tensor a layout keeps as it is (bf16): all but the units' weights."""
    return sum(2 * t.numel() for k, t in source.items() if k.removesuffix(".weight") not in units)


def build(model_dir: Path, out: Path, layout: Mapping[str, str], base: str) -> QuantRecipe:
    """Write the checkpoint of ``layout`` ({unit: choice}) to ``out``; returns its ``quantization.json``.

    ``base`` is the top-level recipe; every unit whose choice differs is in ``layer_schemes``."""
    model_dir, out = Path(model_dir), Path(out)
    source = source_tensors(model_dir)
    base_s = parse_project(base)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    schemes: dict[str, LayerScheme] = {}
    for key, t in source.items():
        unit = key.removesuffix(".weight")
        if unit in layout:
            s = parse_project(layout[unit])
            codes, scale = quantize(t.double().numpy(), s)
            tensors[unit + ".qweight"] = torch.from_numpy(pack_codes(codes, s.bits))
            tensors[unit + ".scales"] = torch.from_numpy(scale).to(torch.bfloat16).contiguous()
            if s != base_s:
                schemes[unit] = {"bits": s.bits, "group_size": s.group_size}
        else:
            tensors[key] = t.to(torch.bfloat16).contiguous()
    missing = sorted(set(layout) - {k.removesuffix(".weight") for k in source})
    if missing:
        raise FidelityError(f"{model_dir}: layout names units the model does not have: {missing[:3]}")
    from safetensors.torch import save_file

    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    shutil.copyfile(model_dir / CONFIG_FILE, out / CONFIG_FILE)
    meta: QuantRecipe = {"method": METHOD, "bits": base_s.bits, "group_size": base_s.group_size, "code_kind": "int",
                         "library": LIBRARY, "simulated": False, "layers": sorted(layout)}
    if schemes:
        meta["layer_schemes"] = dict(sorted(schemes.items()))
    meta["on_disk_bytes"] = sum((out / n).stat().st_size for n in (CONFIG_FILE, WEIGHTS_FILE))
    meta["source_model_sha256"] = sha256_file(model_dir / WEIGHTS_FILE)
    (out / QUANT_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta
