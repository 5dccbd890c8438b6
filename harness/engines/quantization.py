"""The quantized checkpoint format's manifest (``quantization.json``): its files, its recipe, its identity.

Torch-free: identifying a model (:func:`harness.engines.identity.model_identity`) reads the recipe
without loading anything; :mod:`harness.engines.quantized` loads the weights the recipe describes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.errors import VerificationError
from harness.io.hashing import sha256_file
from harness.io.jsonio import read_json

QUANT_FILE = "quantization.json"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
REQUIRED_FILES = (CONFIG_FILE, QUANT_FILE, WEIGHTS_FILE)
CODE_KINDS = ("int", "int_asym", "fp8_e4m3", "e2m1")
_IDENTITY_KEYS = ("method", "bits", "group_size", "library", "simulated", "code_kind", "layers")
#: Optional recipe fields carried into the identity when present (e.g. the seed of stochastic rounding).
_OPTIONAL_IDENTITY_KEYS = ("seed",)


def is_quantized_checkpoint(model_dir: Path) -> bool:
    """True when the folder holds a ``quantization.json``."""
    return (Path(model_dir) / QUANT_FILE).is_file()


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise VerificationError(path, "missing file", "a file", "nothing")
    doc: dict[str, Any] = read_json(path)
    return doc


def read_quant(model_dir: Path) -> dict[str, Any]:
    """The recipe of a quantized checkpoint (``quantization.json``), its required files and keys checked."""
    for name in REQUIRED_FILES:
        if not (model_dir / name).is_file():
            raise VerificationError(model_dir / name, "missing file", "a file", "nothing")
    q = _read_json(model_dir / QUANT_FILE)
    for key in _IDENTITY_KEYS:
        if key not in q:
            raise VerificationError(model_dir / QUANT_FILE, f"missing key {key!r}", key, sorted(q))
    if q["code_kind"] not in CODE_KINDS:
        raise VerificationError(model_dir / QUANT_FILE, "unknown code_kind", CODE_KINDS, q["code_kind"])
    return q


def quantization_identity(model_dir: Path, hashes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Identity of a quantized checkpoint: recipe fields plus the sha256 of every file.

    ``hashes``: sha256 already computed for some of the folder's files (by name), reused so that
    identifying a model reads each of its files once."""
    model_dir = Path(model_dir)
    known = dict(hashes or {})
    q = read_quant(model_dir)
    files = sorted(p for p in model_dir.iterdir() if p.is_file())
    return {
        "method": q["method"],
        "bits": q["bits"],
        "group_size": q["group_size"],
        "library": q["library"],
        "simulated": q["simulated"],
        "source_model_sha256": q.get("source_model_sha256"),
        **{k: q[k] for k in _OPTIONAL_IDENTITY_KEYS if k in q},
        "files": {p.name: known[p.name] if p.name in known else sha256_file(p) for p in files},
    }
