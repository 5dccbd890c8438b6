"""Identity by content: what a model, a runtime and a cache key are, in hashes.

A model's identity is the sha256 of its ``config.json`` and of every weight file (sorted by
name), plus its folder name for humans; a quantized checkpoint (``quantization.json`` present)
also carries the quantization identity (:mod:`harness.engines.quant_manifest`). Two folders with
the same bytes have the same identity wherever they live. Identifying a model reads each of its
files once; a pytest run identifies each live candidate once.
"""

from __future__ import annotations

import functools
import json
import platform
from pathlib import Path
from typing import Any

import harness
from harness.engines.hub import hub_origin, verify_snapshot
from harness.engines.quant_manifest import is_quantized_checkpoint, quantization_identity
from harness.errors import FidelityError
from harness.io.hashing import sha256_bytes, sha256_file
from harness.io.jsonio import JSONObject

#: Suffixes of weight files that count towards a model's identity.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def weight_files(model_dir: str | Path) -> list[Path]:
    """Weight files directly in ``model_dir`` (any known suffix), sorted by name."""
    root = Path(model_dir)
    return sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def model_identity(model_dir: str | Path) -> JSONObject:
    """Identity of a model folder by content.

    name: folder name (informative only).
    config_sha256: sha256 of config.json.
    weights: ``{file name: sha256}`` of every weight file, sorted by name.
    quantization: the quantization identity, only for quantized checkpoints.
    hub: ``{"repo_id", "commit", "blobs"}`` (``blobs``: each file's blob name, its verified digest) for a snapshot
    of the Hugging Face cache (``model = "hf://org/repo@rev"``,
    :mod:`harness.engines.hub`), only then.
    """
    root = Path(model_dir)
    cfg = root / "config.json"
    if not cfg.is_file():
        raise FidelityError(f"{cfg}: config.json missing: not a model folder")
    hashes = {p.name: sha256_file(p) for p in [cfg, *weight_files(root)]}  # each file read once
    ident: dict[str, Any] = {
        "name": root.resolve().name,
        "config_sha256": hashes[cfg.name],
        "weights": {p.name: hashes[p.name] for p in weight_files(root)},
    }
    if is_quantized_checkpoint(root):
        ident["quantization"] = quantization_identity(root, hashes)

    origin = hub_origin(root)
    if origin is not None:  # a snapshot of the Hugging Face cache: the repository, the resolved commit, and each
        # file's blob digest, checked against its content (weights: the sha256 computed above, not read again)
        ident["hub"] = {**origin, "blobs": verify_snapshot(root, hashes)}
    return ident


def runtime_identity() -> dict[str, str]:
    """Versions of the runtime pieces that can change numbers: python, torch, transformers, numpy, harness
    (read once per process: a version does not change while it runs)."""
    return dict(_runtime_identity())


@functools.cache
def _runtime_identity() -> dict[str, str]:
    import numpy

    out = {"python": platform.python_version(), "numpy": numpy.__version__, "harness": harness.__version__}
    try:
        import torch

        out["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        out["torch"] = "absent"
    from importlib import metadata

    try:  # the installed distribution's version (what ``transformers.__version__`` says), read without importing
        # it: importing transformers costs seconds, and a rerun served from the caches loads no model
        out["transformers"] = metadata.version("transformers")
    except metadata.PackageNotFoundError:  # pragma: no cover
        out["transformers"] = "absent"
    return out


def identity_key(d: JSONObject) -> str:
    """Stable cache key: sha256 of the canonical JSON (sorted keys, compact) of ``d``."""
    return sha256_bytes(json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8"))
