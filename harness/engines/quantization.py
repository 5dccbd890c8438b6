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
#: Optional recipe fields carried into the identity when present (e.g. the seed of stochastic rounding, the
#: per-layer schemes of a mixed layout).
_OPTIONAL_IDENTITY_KEYS = ("seed", "layer_schemes")
#: ``layer_schemes`` (optional): ``{layer: {"bits": b, "group_size": g}}`` for layers of ``layers`` quantized with
#: another bit width and/or group size than the top-level ``bits`` / ``group_size`` (same ``code_kind``; group
#: ``None`` = one scale per output row). A file without it is a uniform layout, as before.
LAYER_SCHEMES = "layer_schemes"
_MAX_BITS = 8


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
    _check_layer_schemes(model_dir / QUANT_FILE, q)
    return q


def _check_layer_schemes(path: Path, q: dict[str, Any]) -> None:
    schemes = q.get(LAYER_SCHEMES)
    if schemes is None:
        return
    if not isinstance(schemes, dict):
        raise VerificationError(path, LAYER_SCHEMES, "an object {layer: {bits, group_size}}", type(schemes).__name__)
    layers = set(q["layers"])
    for name, sc in schemes.items():
        if name not in layers:
            raise VerificationError(path, f"{LAYER_SCHEMES}: layer {name!r}", "a layer listed in 'layers'", "absent there")
        if not isinstance(sc, dict) or set(sc) != {"bits", "group_size"}:
            raise VerificationError(path, f"{LAYER_SCHEMES}[{name!r}]", "keys bits, group_size",
                                    sorted(sc) if isinstance(sc, dict) else type(sc).__name__)
        bits, group = sc["bits"], sc["group_size"]
        if type(bits) is not int or not 2 <= bits <= _MAX_BITS:
            raise VerificationError(path, f"{LAYER_SCHEMES}[{name!r}].bits", f"an integer in [2, {_MAX_BITS}]", bits)
        if group is not None and (type(group) is not int or group <= 0):
            raise VerificationError(path, f"{LAYER_SCHEMES}[{name!r}].group_size", "a positive integer or null", group)


def layer_recipe(q: dict[str, Any], layer: str) -> dict[str, Any]:
    """The recipe one layer is quantized with: the top-level recipe, with its ``layer_schemes`` entry applied."""
    sc = (q.get(LAYER_SCHEMES) or {}).get(layer)
    return q if sc is None else {**q, "bits": sc["bits"], "group_size": sc["group_size"]}


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
