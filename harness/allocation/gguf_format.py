"""GGUF layouts: llama.cpp quantizes a BF16 GGUF with one ggml type per tensor; read back what it wrote.

Reasoning: docs/allocation.md §"GGUF layouts".
"""

from __future__ import annotations

import ctypes
import enum
import importlib
import re
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Protocol

import numpy as np

from harness.errors import FidelityError, MissingPackageError, VerificationError

_KINDS = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
          "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
_UNIT_RE = re.compile(r"^model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")
TOKEN_EMBEDDING = "token_embd.weight"


def gguf_name(unit: str) -> str:
    """The GGUF tensor name of a unit (docs/allocation.md §"GGUF layouts")."""
    m = _UNIT_RE.match(unit)
    if not m or m.group(2) not in _KINDS:
        raise FidelityError(f"unit {unit!r}: no GGUF tensor name known for it (decoder-layer linears only)")
    return f"blk.{m.group(1)}.{_KINDS[m.group(2)]}.weight"


def pattern(unit: str) -> str:
    """The anchored regular expression that names exactly this unit's GGUF tensor."""
    return "^" + re.escape(gguf_name(unit)) + "$"


def tensor_type_lines(layout: Mapping[str, str], token_embedding_type: str) -> list[str]:
    """``llama-quantize`` arguments for the layout: one ``--tensor-type PATTERN=type`` per unit, then the embedding's."""
    lines = [f"--tensor-type '{pattern(u)}={t.lower()}'" for u, t in sorted(layout.items())]
    return lines + [f"--token-embedding-type {token_embedding_type.lower()}"]


class GgufTensor(Protocol):
    """What this module reads of a tensor of ``gguf.GGUFReader`` (its ``ReaderTensor``)."""

    name: str
    #: the ggml type written (``gguf.GGMLQuantizationType``: ``.name`` is ``Q4_0``, ...)
    tensor_type: enum.IntEnum
    #: ggml order: ``[in, out]``
    shape: np.ndarray
    #: the tensor's data bytes in the file
    n_bytes: int
    #: the raw blocks, as ``gguf.quants.dequantize`` takes them
    data: np.ndarray


def _require() -> ModuleType:
    try:
        gguf = importlib.import_module("gguf")
    except ImportError:
        raise MissingPackageError.extra("gguf", "gguf", needed_for="GGUF layouts") from None
    return gguf


def ggml_type(name: str) -> int:
    """The ggml type number of a type name (``Q4_0`` -> 2)."""
    gguf = _require()
    try:
        return int(gguf.GGMLQuantizationType[name.upper()])
    except KeyError:
        raise FidelityError(f"unknown ggml type {name!r}") from None


def quantize(src: Path, dst: Path, layout: Mapping[str, str], *, token_embedding_type: str = "Q8_0",
             threads: int = 1) -> Path:
    """Write ``dst``: ``src`` (a BF16 GGUF) quantized by llama.cpp with the layout's type per unit."""
    try:
        import llama_cpp
    except ImportError:
        raise MissingPackageError.extra("llama-cpp-python", "llamacpp", needed_for="building GGUF layouts",
                                        hint='it builds llama.cpp: set CMAKE_ARGS="-DGGML_NATIVE=OFF" for a portable build') from None
    items = sorted(layout.items())
    keep = [pattern(u).encode() for u, _ in items]  # the C strings must outlive the call
    arr = (llama_cpp.llama_model_tensor_override * (len(items) + 1))()
    for i, ((_, t), pat) in enumerate(zip(items, keep)):
        arr[i].pattern = pat
        arr[i].type = ggml_type(t)
    arr[len(items)].pattern = None  # the list ends at a null pattern
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.nthread = threads
    params.token_embedding_type = ggml_type(token_embedding_type)
    params.tt_overrides = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
    dst.parent.mkdir(parents=True, exist_ok=True)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise FidelityError(f"llama_model_quantize({src} -> {dst}) returned {rc}")
    return dst


def read_tensors(path: Path) -> dict[str, GgufTensor]:
    """``{name: gguf ReaderTensor}`` of a GGUF file."""
    gguf = _require()
    try:
        return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    except Exception as exc:  # the reader raises several types for a corrupt file
        raise VerificationError(path, "GGUF file", "a readable GGUF", repr(exc)) from None


def types_and_bytes(path: Path) -> tuple[dict[str, str], dict[str, int]]:
    """``({tensor: ggml type name}, {tensor: data bytes})`` as written in the file."""
    ts = read_tensors(path)
    return {n: t.tensor_type.name for n, t in ts.items()}, {n: int(t.n_bytes) for n, t in ts.items()}


def unit_weights(path: Path, units: list[str]) -> dict[str, tuple[str, np.ndarray]]:
    """``{unit: (ggml type written, float32 [out, in] effective weight)}`` read from a GGUF file."""
    gguf = _require()
    ts = read_tensors(path)
    out = {}
    for u in units:
        t = ts.get(gguf_name(u))
        if t is None:
            raise VerificationError(path, f"tensor {gguf_name(u)}", "present", "absent")
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        out[u] = (t.tensor_type.name, w.reshape(int(t.shape[1]), int(t.shape[0])))
    return out
