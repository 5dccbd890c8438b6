"""Bits per weight of a checkpoint, from its stored tensors (codes, scales, zeros): docs/allocation.md,
section "Bits per weight".

Two figures: over the quantized linear weights (every stored bit of the quantized modules divided by
their weight count) and over the whole checkpoint (every stored tensor bit divided by the parameter
count: the quantized modules' weight counts plus every other stored tensor's elements). Bytes come
from the files' tensor tables (safetensors ``data_offsets``, GGUF ``n_bytes``); headers, metadata and
``config.json`` are not counted. How each format names its quantized modules and their weight counts
is :data:`FORMATS`. A format that stores each code in a wider integer than the code's bits says so
in ``note`` (its bits per weight are what is stored, not the code width).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TypedDict

from harness.allocation.gguf_format import read_tensors
from harness.attribution.sizes import folder_tensor_bytes
from harness.engines.quant_manifest import QUANT_FILE, WEIGHTS_FILE, layer_recipe, read_quant
from harness.errors import VerificationError
from harness.io.jsonio import JSONObject
from harness.io.safetensors_header import read_header

__all__ = ["FORMATS", "BitsPerWeight", "bits_per_weight", "checkpoint_format"]

#: The formats read, and how each one's quantized modules and weight counts are found.
FORMATS = {
    "project": "quantization.json lists the modules; weights = qweight bits / the layer's code bits",
    "compressed-tensors": "modules with weight_packed (weights = the stored weight_shape, else packed bits / the "
                          "config's num_bits) or an 8-bit weight with weight_scale (weights = its elements)",
    "torchao": "modules whose weight the safetensors metadata names a torchao tensor; weights = qdata elements "
               "(x 8 / code bits when the codes are packed)",
    "gptq-like": "AutoRound / GPTQ / AWQ: modules with an int32 qweight; weights = its elements x 32 / bits",
    "gguf": "tensors of a quantized ggml type (the token embedding too, when quantized); weights = their elements",
    "plain": "no quantized module: every stored tensor is a parameter",
}
_FLOAT_GGML = {"F32", "F16", "BF16", "F64"}
_INT_BITS = {"int1": 1, "int2": 2, "int3": 3, "int4": 4, "int5": 5, "int6": 6, "int7": 7, "int8": 8,
             "uint4": 4, "uint8": 8, "float8_e4m3fn": 8, "float8_e5m2": 8}
_DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "I16": 16, "U16": 16, "F16": 16,
               "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64}


class BitsPerWeight(TypedDict):
    """One checkpoint's bits per weight (module docstring)."""

    #: a key of :data:`FORMATS`
    format: str
    #: bits stored for the quantized modules (codes, scales, zeros, ...) and their weight count
    linear_bits: int
    linear_weights: int
    #: linear_bits / linear_weights; None when nothing is quantized
    linear_bpw: float | None
    #: every stored tensor's bits, and the parameter count they are divided by
    total_bits: int
    total_params: int
    total_bpw: float
    n_quantized_modules: int
    #: how codes are stored when not packed to their width (e.g. "int4 codes stored one per int8"), else None
    note: str | None


def checkpoint_format(model: Path) -> str:
    """The key of :data:`FORMATS` a checkpoint (folder or ``.gguf`` file) is read as."""
    if model.is_file():
        return "gguf"
    if (model / QUANT_FILE).is_file():
        return "project"
    qc = _quant_config(model)
    method = str(qc.get("quant_method", "")).lower() if qc else ""
    if method == "compressed-tensors":
        return "compressed-tensors"
    if method == "torchao":
        return "torchao"
    if method in ("auto-round", "intel/auto-round", "autoround", "gptq", "awq"):
        return "gptq-like"
    if qc:
        raise VerificationError(model / "config.json", "quantization_config.quant_method",
                                "compressed-tensors, torchao, auto-round, gptq, awq or none", method or None)
    return "plain"


def _quant_config(model: Path) -> JSONObject | None:
    path = model / "config.json"
    if not path.is_file():
        return None
    try:
        qc = json.loads(path.read_text(encoding="utf-8")).get("quantization_config")
    except (OSError, ValueError, AttributeError) as exc:
        raise VerificationError(path, "model config", "readable JSON object", repr(exc)) from None
    return qc if isinstance(qc, dict) else None


def _specs(model: Path) -> tuple[dict[str, tuple[str, list[int]]], dict[str, str], dict[str, Path]]:
    """``({name: (dtype, shape)}, the files' merged __metadata__, {name: file})`` from the files' headers."""
    specs: dict[str, tuple[str, list[int]]] = {}
    meta: dict[str, str] = {}
    where: dict[str, Path] = {}
    for f in sorted(model.glob("*.safetensors")):
        header = read_header(f)
        meta.update(header.metadata)
        for name, t in header.tensors.items():
            specs[name] = (t.dtype, list(t.shape))
            where[name] = f
    return specs, meta, where


def _module(name: str) -> str:
    return name.rsplit(".", 1)[0]


def _result(fmt: str, q_bits: int, q_weights: int, n_q: int, total_bits: int, other_params: int,
            note: str | None) -> BitsPerWeight:
    total_params = q_weights + other_params
    return {"format": fmt, "linear_bits": q_bits, "linear_weights": q_weights,
            "linear_bpw": q_bits / q_weights if q_weights else None, "total_bits": total_bits,
            "total_params": total_params, "total_bpw": total_bits / total_params if total_params else 0.0,
            "n_quantized_modules": n_q, "note": note}


def _ct_num_bits(model: Path) -> int:
    """The one weight ``num_bits`` of a compressed-tensors checkpoint's config groups."""
    groups = (_quant_config(model) or {}).get("config_groups")
    bits: set[int] = set()
    for g in (groups.values() if isinstance(groups, dict) else ()):
        w = g.get("weights") if isinstance(g, dict) else None
        if isinstance(w, dict) and isinstance(w.get("num_bits"), int):
            bits.add(int(str(w["num_bits"])))
    if len(bits) != 1:
        raise VerificationError(model / "config.json", "config_groups weights.num_bits", "one value", sorted(bits))
    return bits.pop()


def _integral(model: Path, what: str, x: float) -> int:
    if x != int(x):
        raise VerificationError(model, what, "a whole number of weights", x)
    return int(x)


def _quantized_safetensors(model: Path, fmt: str, specs: dict[str, tuple[str, list[int]]], meta: dict[str, str],
                           where: dict[str, Path], nbytes: dict[str, int]) -> tuple[dict[str, int], str | None]:
    """``{quantized module: weight count}`` of a safetensors checkpoint, and the unpacked-codes note."""
    out: dict[str, int] = {}
    note = None
    if fmt == "project":
        q = read_quant(model)
        for layer in q["layers"]:
            bits = layer_recipe(q, layer)["bits"]
            out[layer] = _integral(model / WEIGHTS_FILE, f"{layer}.qweight bits / {bits}", nbytes[f"{layer}.qweight"] * 8 / bits)
    elif fmt == "compressed-tensors":
        from safetensors import safe_open

        for name, (dtype, shape) in specs.items():
            m = _module(name)
            if name.endswith(".weight_packed") and f"{m}.weight_shape" in specs:
                with safe_open(str(where[f"{m}.weight_shape"]), framework="pt") as fh:
                    out[m] = math.prod(int(v) for v in fh.get_tensor(f"{m}.weight_shape").reshape(-1).tolist())
            elif name.endswith(".weight_packed"):  # no weight_shape stored (nvfp4): codes of num_bits, packed
                bits = _ct_num_bits(model)
                out[m] = _integral(model, f"{name} bits / {bits}", math.prod(shape) * _DTYPE_BITS.get(dtype, 8) / bits)
            elif name.endswith(".weight") and _DTYPE_BITS.get(dtype, 16) <= 8 and f"{m}.weight_scale" in specs:
                out[m] = math.prod(shape)
    elif fmt == "torchao":
        for name, text in meta.items():
            info = json.loads(text) if text.startswith("{") else {}
            kind = str(info.get("_type", "Tensor"))
            if kind == "Tensor" or not name.endswith("weight"):
                continue
            m, attr = name.rsplit(".", 1)
            dtype, shape = specs[f"{m}._{attr}_qdata"]
            target = ((info.get("_data") or {}).get("target_dtype") or {}).get("_data")
            code_bits = _INT_BITS.get(str(target), _DTYPE_BITS.get(dtype, 8)) if target else _DTYPE_BITS.get(dtype, 8)
            stored = _DTYPE_BITS.get(dtype, 8)
            if "Unpacked" in kind or code_bits == stored:
                out[m] = math.prod(shape)
                if code_bits < stored:
                    note = f"{target} codes stored unpacked, one per {dtype.lower()} ({kind})"
            else:
                out[m] = _integral(model, f"{m}._{attr}_qdata bits / {code_bits}", math.prod(shape) * stored / code_bits)
    elif fmt == "gptq-like":
        value = (_quant_config(model) or {}).get("bits")
        bits = value if isinstance(value, int) else 0
        if not 1 <= bits <= 8:
            raise VerificationError(model / "config.json", "quantization_config.bits", "an integer in [1, 8]", bits or None)
        for name, (dtype, shape) in specs.items():
            if name.endswith(".qweight") and dtype == "I32":
                out[_module(name)] = _integral(model, f"{name} elements x 32 / {bits}", math.prod(shape) * 32 / bits)
    return out, note


def bits_per_weight(model: Path) -> BitsPerWeight:
    """Bits per weight of a checkpoint folder or ``.gguf`` file (module docstring)."""
    model = Path(model)
    fmt = checkpoint_format(model)
    if fmt == "gguf":
        ts = read_tensors(model)
        coded = {n: t for n, t in ts.items() if t.tensor_type.name not in _FLOAT_GGML}
        other = {n: t for n, t in ts.items() if n not in coded}
        return _result(fmt, sum(int(t.n_bytes) * 8 for t in coded.values()),
                       sum(math.prod(int(x) for x in t.shape) for t in coded.values()), len(coded),
                       sum(int(t.n_bytes) * 8 for t in ts.values()),
                       sum(math.prod(int(x) for x in t.shape) for t in other.values()), None)
    nbytes = folder_tensor_bytes(model)
    specs, meta, where = _specs(model)
    quant, note = _quantized_safetensors(model, fmt, specs, meta, where, nbytes)
    # a quantized module's bias is a parameter of its own, not part of the module's stored weight
    in_q = {n for n in specs if _module(n) in quant and not n.endswith(".bias")}
    other_params = sum(math.prod(shape) for n, (_d, shape) in specs.items() if n not in in_q)
    return _result(fmt, sum(nbytes[n] * 8 for n in in_q), sum(quant.values()), len(quant),
                   sum(b * 8 for b in nbytes.values()), other_params, note)

