"""Bytes of a model's stored tensors, read from the safetensors headers (no tensor is loaded).

Reasoning: docs/diagnostics.md §"Stored bytes".
"""

from __future__ import annotations

from pathlib import Path

from harness.attribution.groups import fused_experts, module_of, split_unit
from harness.errors import VerificationError
from harness.io.safetensors_header import read_header


def tensor_bytes(path: Path) -> dict[str, int]:
    """``{tensor name: bytes}`` of one safetensors file, from its header (:func:`harness.io.safetensors_header.read_header`)."""
    return {name: t.nbytes for name, t in read_header(path).tensors.items()}


def folder_tensor_bytes(model_dir: Path) -> dict[str, int]:
    """``{tensor name: bytes}`` over every ``*.safetensors`` file of a model folder."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise VerificationError(model_dir, "weight files", "*.safetensors", "none")
    out: dict[str, int] = {}
    for f in files:
        for k, v in tensor_bytes(f).items():
            if k in out:
                raise VerificationError(f, f"tensor {k!r}", "stored once", "in two weight files")
            out[k] = v
    return out


def module_bytes(stored: dict[str, int], modules: set[str]) -> int:
    """Bytes of the stored tensors that belong to any of ``modules`` (see docs/diagnostics.md §"Stored bytes")."""
    return sum(b for name, b in stored.items() if name.rsplit(".", 1)[0] in modules)


def unit_bytes(stored: dict[str, int], unit: str, experts: dict[str, int]) -> int:
    """Bytes of one attribution unit: a parameter's module, or a fused experts tensor / one expert's
    slice of it (docs/diagnostics.md §"Stored bytes"; ``experts``: the expert count of each fused tensor)."""
    p, e = split_unit(unit)
    if not fused_experts(p):
        return module_bytes(stored, {module_of(p)})
    base, proj = p.rsplit(".", 1)
    n = experts.get(p, 1)
    projs = ("gate_proj", "up_proj") if proj == "gate_up_proj" else (proj,)
    picked = range(n) if e is None else (e,)
    split = module_bytes(stored, {f"{base}.{i}.{q}" for i in picked for q in projs})
    fused = sum(b for name, b in stored.items() if name == p or name.rsplit(".", 1)[0] == p)
    return split + (fused if e is None else fused // n)
