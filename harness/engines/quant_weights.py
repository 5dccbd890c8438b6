"""Load quantized checkpoints (the fixture candidates) as dequantized transformers models.

A quantized checkpoint is a folder with ``config.json``, ``quantization.json`` and ``model.safetensors``
(packed codes and scales per quantized linear), dequantized on load into the bf16 weights it represents.

Reasoning: docs/engines.md §"Dequantized fixture candidates".
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from harness.engines.quant_manifest import QUANT_FILE, WEIGHTS_FILE, QuantRecipe, layer_recipe, read_quant
from harness.errors import VerificationError


def fp8_e4m3_table() -> np.ndarray:
    """float64 value of each of the 256 float8 e4m3fn bit patterns (NaN for 0x7f / 0xff)."""
    b = np.arange(256)
    sign = np.where(b >> 7, -1.0, 1.0)
    e = (b >> 3) & 15
    m = (b & 7).astype(np.float64)
    val = np.where(e == 0, m * 2.0**-9, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    val = np.where((e == 15) & (m == 7), np.nan, val)
    out: np.ndarray = np.asarray(sign * val, dtype=np.float64)
    return out


def e2m1_table() -> np.ndarray:
    """float64 value of each of the 16 fp4 e2m1 codes (bit 3 is the sign)."""
    mags = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    return np.concatenate([mags, -mags])


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned codes (< 2**bits) into uint8, most-significant bit first."""
    c = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1)
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint8)
    return np.packbits(((c[:, None] >> shifts) & 1).astype(np.uint8).reshape(-1))


def unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack_codes`: ``count`` codes as int64."""
    flat = np.unpackbits(np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1))[: count * bits]
    weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.int64)
    return flat.reshape(count, bits).astype(np.int64) @ weights


def packed_size(count: int, bits: int) -> int:
    """Bytes that :func:`pack_codes` produces for ``count`` codes."""
    return (count * bits + 7) // 8


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file (torch; verified readable)."""
    try:
        out: dict[str, torch.Tensor] = {}
        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():
                out[key] = fh.get_tensor(key)
        return out
    except Exception as exc:  # safetensors raises several types for corrupt files
        raise VerificationError(path, "unreadable safetensors", "a valid safetensors file", repr(exc)) from exc


def _expect(path: Path, what: str, expected: object, found: object) -> None:
    if expected != found:
        raise VerificationError(path, what, expected, found)


def _code_values(kind: str, codes: np.ndarray, bits: int) -> np.ndarray:
    if kind == "int":
        return (codes - (1 << (bits - 1))).astype(np.float64)
    if kind == "int_asym":
        return codes.astype(np.float64)
    table = fp8_e4m3_table() if kind == "fp8_e4m3" else e2m1_table()
    values: np.ndarray = table[codes]
    return values


def dequantize_layer(
    path: Path, tensors: dict[str, torch.Tensor], prefix: str, shape: tuple[int, int], q: QuantRecipe
) -> np.ndarray:
    """float64 ``[out, in]`` dequantized weight of one layer, after verifying its tensors."""
    out_f, in_f = shape
    bits, kind = int(q["bits"]), q["code_kind"]
    group = int(q["group_size"]) if q["group_size"] else in_f
    if in_f % group:
        raise VerificationError(path, f"{prefix}: in_features not a multiple of group_size", group, in_f)
    needed = [".qweight", ".scales"] + ([".zeros"] if kind == "int_asym" else [])
    needed += [".global_scale"] if kind == "e2m1" else []
    for suffix in needed:
        if prefix + suffix not in tensors:
            raise VerificationError(path, "missing tensor", prefix + suffix, "absent")
    qw = tensors[prefix + ".qweight"]
    _expect(path, f"{prefix}.qweight dtype", torch.uint8, qw.dtype)
    _expect(path, f"{prefix}.qweight size", packed_size(out_f * in_f, bits), qw.numel())
    codes = unpack_codes(qw.numpy(), bits, out_f * in_f).reshape(out_f, in_f)
    values = _code_values(kind, codes, bits)
    sc = tensors[prefix + ".scales"]
    _expect(path, f"{prefix}.scales shape", (out_f, in_f // group), tuple(sc.shape))
    if kind == "e2m1":
        _expect(path, f"{prefix}.scales dtype", torch.uint8, sc.dtype)
        scales = fp8_e4m3_table()[sc.numpy().astype(np.int64)]
    else:
        _expect(path, f"{prefix}.scales dtype", torch.bfloat16, sc.dtype)
        scales = sc.double().numpy()
    if not np.isfinite(scales).all():
        raise VerificationError(path, f"{prefix}.scales", "finite values", "NaN/Inf")
    if kind == "int_asym":
        zt = tensors[prefix + ".zeros"]
        _expect(path, f"{prefix}.zeros shape", (out_f, in_f // group), tuple(zt.shape))
        zeros = zt.double().numpy()
        if not np.isfinite(zeros).all():
            raise VerificationError(path, f"{prefix}.zeros", "finite values", "NaN/Inf")
        values = values - np.repeat(zeros, group, axis=1)
    w = values * np.repeat(scales, group, axis=1)
    if kind == "e2m1":
        gs = tensors[prefix + ".global_scale"].double().numpy().reshape(-1)
        _expect(path, f"{prefix}.global_scale size", 1, gs.size)
        if not math.isfinite(float(gs[0])):
            raise VerificationError(path, f"{prefix}.global_scale", "a finite value", float(gs[0]))
        w = w * float(gs[0])
    if not np.isfinite(w).all():
        raise VerificationError(path, f"{prefix} dequantized weight", "finite values", "NaN/Inf")
    weight: np.ndarray = w
    return weight


def load_quantized(
    model_dir: Path, device: str = "cpu", dtype: torch.dtype = torch.bfloat16
) -> torch.nn.Module:
    """Build the model of ``config.json`` with dequantized linear weights (eval mode).

    Every file is verified first: missing files, missing/extra tensors, wrong
    shapes or dtypes and non-finite scales raise :class:`VerificationError`.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = Path(model_dir)
    q = read_quant(model_dir)
    wpath = model_dir / WEIGHTS_FILE
    tensors = _read_tensors(wpath)
    config = AutoConfig.from_pretrained(str(model_dir))
    config._attn_implementation = "eager"
    with torch.device("meta"):
        meta_model: torch.nn.Module = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    expected = {k: tuple(v.shape) for k, v in meta_model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        expected.pop("lm_head.weight", None)
    layers = set(q["layers"])
    state: dict[str, torch.Tensor] = {}
    for prefix in sorted(layers):
        key = prefix + ".weight" if prefix + ".weight" in expected else prefix
        if key not in expected or len(expected[key]) not in (2, 3):
            raise VerificationError(model_dir / QUANT_FILE, "layer not in model",
                                    "a linear or 3-D expert tensor of config.json", prefix)
        shape = expected[key]
        rows = math.prod(shape[:-1])  # fused experts [experts, out, in]: their [experts * out, in] rows
        w = dequantize_layer(wpath, tensors, prefix, (rows, shape[-1]), layer_recipe(q, prefix)).reshape(shape)
        state[key] = torch.from_numpy(w).to(torch.float32).to(dtype)
    suffixes = (".qweight", ".scales", ".zeros", ".global_scale")
    for key, t in tensors.items():
        if any(key.endswith(s) for s in suffixes) and key.rsplit(".", 1)[0] in layers:
            continue
        if key not in expected or key in state:
            raise VerificationError(wpath, "unexpected tensor", "a model parameter", key)
        _expect(wpath, f"{key} shape", expected[key], tuple(t.shape))
        if not torch.isfinite(t.float()).all():
            raise VerificationError(wpath, key, "finite values", "NaN/Inf")
        state[key] = t.to(dtype)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise VerificationError(wpath, "missing tensors", "every model parameter", f"{len(missing)} absent: {missing[:3]}")
    model: torch.nn.Module = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    model.load_state_dict(state, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()  # type: ignore[operator]
    return model.to(device).eval()
