"""The shared BF16 LM head (docs/design.md, section 2, "Capture point").

Both the reference and the candidate hidden states go through one head, so the primary KLD
measures the model body. The head is ``lm_head.safetensors`` with one tensor ``weight``
``[vocab, hidden]`` bf16, and a sidecar ``lm_head.json``:

sha256: sha256 of the safetensors file.
vocab_size, hidden_size: the tensor's shape.
dtype: always ``"bfloat16"``.
source_model: ``harness.engines.identity.model_identity`` of the model it was exported from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.engines.identity import model_identity
from harness.errors import FidelityError, VerificationError
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.hashing import sha256_bytes, sha256_file
from harness.io.jsonio import read_json
from harness.io.safetensors_header import corrupt

if TYPE_CHECKING:
    import torch

TENSOR_NAME = "weight"


@dataclass(frozen=True)
class HeadTensor:
    """A verified head: ``weight`` ``[vocab, hidden]`` bf16, its file's ``sha256`` and ``path``."""

    weight: torch.Tensor
    sha256: str
    path: Path
    #: The sidecar's ``source_model`` (identity of the model the head was exported from), if recorded.
    source_model: dict[str, Any] | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.weight.shape[1])


def sidecar_path(path: str | Path) -> Path:
    """``lm_head.safetensors`` -> ``lm_head.json``."""
    return Path(path).with_suffix(".json")


def _find_head_weight(model_dir: Path) -> tuple[str, Any]:
    """Read the LM head (or, for tied embeddings, the input embedding) straight from safetensors."""
    from safetensors import safe_open

    cfg = read_json(model_dir / "config.json")
    text_cfg = cfg.get("text_config", cfg)
    tied = bool(cfg.get("tie_word_embeddings", text_cfg.get("tie_word_embeddings", False)))
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FidelityError(f"{model_dir}: no *.safetensors weights to export a head from")
    names: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():
                names[k] = f
    heads = sorted(k for k in names if k.endswith("lm_head.weight"))
    embs = sorted(k for k in names if k.endswith("embed_tokens.weight"))
    # tied: the input embedding *is* the head (lm_head.weight, if saved, is the same tensor)
    candidates = embs + heads if tied else heads
    if not candidates:
        want = "embed_tokens.weight" if tied else "lm_head.weight (tie_word_embeddings is false)"
        raise FidelityError(f"{model_dir}: no {want} tensor in {[f.name for f in files]}")
    key = candidates[0]
    with safe_open(str(names[key]), framework="pt") as fh:
        return key, fh.get_tensor(key)


def export_head(model_dir: str | Path, out_path: str | Path) -> HeadTensor:
    """Export the model's LM head as bf16 ``lm_head.safetensors`` + ``lm_head.json`` (atomically)."""
    import torch
    from safetensors.torch import save

    model_dir = Path(model_dir)
    out_path = Path(out_path)
    if not (model_dir / "config.json").is_file():
        raise FidelityError(f"{model_dir / 'config.json'}: config.json missing: not a model folder")
    _key, w = _find_head_weight(model_dir)
    w = w.to(torch.bfloat16).contiguous()
    if w.ndim != 2 or not bool(torch.isfinite(w).all()):
        raise VerificationError(model_dir, "LM head", "finite 2-D tensor", f"shape {list(w.shape)}, finite={bool(torch.isfinite(w).all())}")

    data = save({TENSOR_NAME: w})
    digest = sha256_bytes(data)
    if out_path.exists() and sha256_file(out_path) != digest:  # captures scored with it would stop matching
        raise VerificationError(out_path, "existing head (a head is never overwritten by another)", digest, sha256_file(out_path),
                                "export to a new --out path")
    source = model_identity(model_dir)
    side = {"sha256": digest, "vocab_size": int(w.shape[0]), "hidden_size": int(w.shape[1]), "dtype": "bfloat16",
            "source_model": source}
    atomic_write_files({out_path: data, sidecar_path(out_path): dumps_json(side)})  # both or neither
    return HeadTensor(w, digest, out_path, source)


def load_head(path: str | Path, expected_sha256: str | None = None) -> HeadTensor:
    """Load and verify a head: sha256 (against the sidecar if present, and ``expected_sha256`` if
    given), tensor name ``weight``, 2-D, bf16, all finite. Anything else: ``VerificationError``."""
    import torch
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise VerificationError(path, "head file missing")
    digest = sha256_file(path)
    side = sidecar_path(path)
    meta: dict[str, Any] = {}
    if side.is_file():
        meta = read_json(side)
        if meta.get("sha256") != digest:
            raise VerificationError(path, "sha256 (vs sidecar lm_head.json)", meta.get("sha256"), digest)
    if expected_sha256 is not None and expected_sha256 != digest:
        raise VerificationError(path, "sha256", expected_sha256, digest)
    try:
        with safe_open(str(path), framework="pt") as fh:
            keys = list(fh.keys())
            if keys != [TENSOR_NAME]:
                raise VerificationError(path, "tensor names", [TENSOR_NAME], keys)
            w = fh.get_tensor(TENSOR_NAME)
    except SafetensorError as e:
        raise corrupt(path, e) from None
    if w.ndim != 2:
        raise VerificationError(path, "weight rank", 2, w.ndim)
    if w.dtype != torch.bfloat16:
        raise VerificationError(path, "weight dtype", "torch.bfloat16", w.dtype)
    if not bool(torch.isfinite(w).all()):
        raise VerificationError(path, "weight values", "all finite", f"{int((~torch.isfinite(w)).sum())} NaN/Inf")
    for i, key in enumerate(("vocab_size", "hidden_size")):
        if key in meta and meta[key] != int(w.shape[i]):
            raise VerificationError(path, f"weight {key} (vs sidecar {side.name})", meta[key], int(w.shape[i]))
    source = meta.get("source_model")
    if source is not None and not isinstance(source, dict):
        raise VerificationError(side, "source_model", "an object (the exporting model's identity)", type(source).__name__)
    return HeadTensor(w, digest, path, source)
