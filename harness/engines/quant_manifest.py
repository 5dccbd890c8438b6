"""The quantized checkpoint format's manifest (``quantization.json``): its files, its recipe, its identity.

Torch-free: identifying a model (:func:`harness.engines.identity.model_identity`) reads the recipe
without loading anything; :mod:`harness.engines.quant_weights` loads the weights the recipe describes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from harness.errors import VerificationError
from harness.io.hashing import sha256_file
from harness.io.jsonio import JSONObject, read_json
from harness.io.schema import check, schema_of

QUANT_FILE = "quantization.json"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
REQUIRED_FILES = (CONFIG_FILE, QUANT_FILE, WEIGHTS_FILE)
CODE_KINDS = ("int", "int_asym", "fp8_e4m3", "e2m1")
_IDENTITY_KEYS = ("method", "bits", "group_size", "library", "simulated", "code_kind", "layers")
#: ``layer_schemes`` (optional): ``{layer: {"bits": b, "group_size": g}}`` for layers of ``layers`` quantized with
#: another bit width and/or group size than the top-level ``bits`` / ``group_size`` (same ``code_kind``; group
#: ``None`` = one scale per output row). A file without it is a uniform layout, as before.
LAYER_SCHEMES = "layer_schemes"
_MAX_BITS = 8


class LayerScheme(TypedDict):
    """One layer's own bit width and group size (``None``: one scale per output row)."""

    bits: int
    group_size: int | None


class QuantRecipe(TypedDict):
    """``quantization.json``: how the checkpoint's layers were quantized (other keys are kept, unread)."""

    method: str
    bits: int
    #: ``None``: one scale per output row
    group_size: int | None
    library: str
    simulated: bool
    code_kind: str
    #: the quantized layers (module names)
    layers: list[str]
    #: the stochastic rounding's seed, where the method draws
    seed: NotRequired[int]
    layer_schemes: NotRequired[dict[str, LayerScheme]]
    #: bytes of the checkpoint's ``config.json`` and weights file: the candidate's on-disk size in its reports
    on_disk_bytes: NotRequired[int]
    source_model_sha256: NotRequired[str | None]


#: :class:`QuantRecipe` as a schema (harness.io.schema.schema_of), checked when the file is read.
_RECIPE_SCHEMA = schema_of(QuantRecipe)


def is_quantized_checkpoint(model_dir: Path) -> bool:
    """True when the folder holds a ``quantization.json``."""
    return (Path(model_dir) / QUANT_FILE).is_file()


def _read_json(path: Path) -> JSONObject:
    if not path.is_file():
        raise VerificationError(path, "missing file", "a file", "nothing")
    doc: JSONObject = read_json(path)
    return doc


def read_quant(model_dir: Path) -> QuantRecipe:
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
    check(q, _RECIPE_SCHEMA, model_dir / QUANT_FILE)
    return cast(QuantRecipe, q)  # checked above


def _check_layer_schemes(path: Path, q: JSONObject) -> None:
    schemes = q.get(LAYER_SCHEMES)
    if schemes is None:
        return
    if not isinstance(schemes, dict):
        raise VerificationError(path, LAYER_SCHEMES, "an object {layer: {bits, group_size}}", type(schemes).__name__)
    listed = q["layers"]
    layers = set(listed) if isinstance(listed, list) else set()
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


def layer_recipe(q: QuantRecipe, layer: str) -> QuantRecipe:
    """The recipe one layer is quantized with: the top-level recipe, with its ``layer_schemes`` entry applied."""
    sc = q.get("layer_schemes", {}).get(layer)
    return q if sc is None else {**q, "bits": sc["bits"], "group_size": sc["group_size"]}


def quantization_identity(model_dir: Path, hashes: Mapping[str, str] | None = None) -> JSONObject:
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
        **({"seed": q["seed"]} if "seed" in q else {}),
        **({"layer_schemes": {name: {"bits": sc["bits"], "group_size": sc["group_size"]}
                              for name, sc in q["layer_schemes"].items()}} if "layer_schemes" in q else {}),
        "files": {p.name: known[p.name] if p.name in known else sha256_file(p) for p in files},
    }
