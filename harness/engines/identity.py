"""Identity by content: what a model, a runtime and a cache key are, in hashes.

A model's identity is the sha256 of its ``config.json`` and of every weight file (sorted by
name), plus its folder name for humans; a quantized checkpoint (``quantization.json`` present)
also carries the quantization identity from ``harness.engines.quantized``. Two folders with the
same bytes have the same identity wherever they live.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from harness.errors import FidelityError
from harness.io.hashing import sha256_bytes, sha256_file

#: Suffixes of weight files that count towards a model's identity.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
QUANTIZATION_JSON = "quantization.json"


def weight_files(model_dir: str | Path) -> list[Path]:
    """Weight files directly in ``model_dir`` (any known suffix), sorted by name."""
    root = Path(model_dir)
    return sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def quantized_module() -> Any:
    """Import ``harness.engines.quantized`` lazily; a clear ``FidelityError`` if it is unavailable."""
    import importlib

    try:
        quantized = importlib.import_module("harness.engines.quantized")
    except ImportError as e:
        raise FidelityError(
            f"this is a quantized checkpoint ({QUANTIZATION_JSON}) but harness.engines.quantized is not available ({e})"
        ) from None
    return quantized


def model_identity(model_dir: str | Path) -> dict[str, Any]:
    """Identity of a model folder by content.

    name: folder name (informative only).
    config_sha256: sha256 of config.json.
    weights: ``{file name: sha256}`` of every weight file, sorted by name.
    quantization: the quantization identity, only for quantized checkpoints.
    hub: ``{"repo_id", "commit"}`` for a snapshot of the Hugging Face cache (``model = "hf://org/repo@rev"``,
    :mod:`harness.engines.hub`), only then.
    """
    root = Path(model_dir)
    cfg = root / "config.json"
    if not cfg.is_file():
        raise FidelityError(f"{cfg}: config.json missing: not a model folder")
    ident: dict[str, Any] = {
        "name": root.resolve().name,
        "config_sha256": sha256_file(cfg),
        "weights": {p.name: sha256_file(p) for p in weight_files(root)},
    }
    if (root / QUANTIZATION_JSON).is_file():
        ident["quantization"] = quantized_module().quantization_identity(root)
    from harness.engines.hub import hub_origin

    origin = hub_origin(root)
    if origin is not None:  # a snapshot of the Hugging Face cache: the repository and the resolved commit
        ident["hub"] = origin
    return ident


def runtime_identity() -> dict[str, str]:
    """Versions of the runtime pieces that can change numbers: python, torch, transformers, numpy, harness."""
    import numpy

    import harness

    out = {"python": platform.python_version(), "numpy": numpy.__version__, "harness": harness.__version__}
    try:
        import torch

        out["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        out["torch"] = "absent"
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        out["transformers"] = "absent"
    return out


def identity_key(d: dict[str, Any]) -> str:
    """Stable cache key: sha256 of the canonical JSON (sorted keys, compact) of ``d``."""
    return sha256_bytes(json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8"))
