"""A published capture folder (``hidden_NNNN.safetensors`` + ``capture-manifest.json``) read in place.

Reasoning: docs/interchange.md §"Capture folders".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.capture.store import CaptureStore, StoreManifest
from harness.errors import VerificationError
from harness.inputs.interchange_layout import (
    CAPTURE_MANIFEST,
    CAPTURE_SCHEMA,
    HIDDEN_RE,
    HIDDEN_TENSOR,
    LAYOUT,
    hidden_filename,
)
from harness.interchange.suite_manifest import published_digest
from harness.io.hashing import sha256_bytes, sha256_file
from harness.io.jsonio import read_json
from harness.io.safetensors_header import corrupt

if TYPE_CHECKING:
    import torch

    from harness.inputs.suite import Suite

#: Identity fields of a published capture that pin what was captured (the path is a label).
IDENTITY_FIELDS = ("model_revision", "index_sha256", "config_sha256", "shard_sha256", "quantization",
                   "quantization_config", "kv_cache_dtype_requested", "kv_cache_dtype_resolved")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def published_identity(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """The identity of a published capture: its recorded ``candidate_identity`` fields by content, and a name."""
    block = doc.get("candidate_identity")
    block = block if isinstance(block, dict) else {}
    return {"name": name, "layout": LAYOUT, "published": {k: block.get(k) for k in IDENTITY_FIELDS}}


def read_folder(folder: Path, suite: Suite) -> tuple[dict[str, Any], dict[int, str], int]:
    """Verify one capture folder's manifest against ``suite``; returns (manifest, index -> sha256, hidden size)."""
    mf = folder / CAPTURE_MANIFEST
    if not mf.is_file():
        raise VerificationError(mf, "capture manifest", "present (capture-manifest.json)", "missing")
    doc = read_json(mf)
    if doc.get("complete") is not True:
        raise VerificationError(mf, "complete", True, doc.get("complete"), "a partial capture is never scored")
    records = doc.get("captures")
    if not isinstance(records, list) or not records:
        raise VerificationError(mf, "captures", "a non-empty list of {index, sha256, shape}", type(records).__name__)
    hashes: dict[int, str] = {}
    shapes: set[tuple[int, ...]] = set()
    for pos, rec in enumerate(records):
        idx = rec.get("index") if isinstance(rec, dict) else None
        if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < suite.n_contexts:
            raise VerificationError(mf, f"captures[{pos}].index", f"an integer 0..{suite.n_contexts - 1}", idx)
        if idx in hashes:
            raise VerificationError(mf, f"captures[{pos}].index", "unique indices", f"{idx} twice")
        sha, shape = rec.get("sha256"), rec.get("shape")
        if not isinstance(sha, str):
            raise VerificationError(mf, f"captures[{pos}].sha256", "a hex string", sha)
        if not (isinstance(shape, list) and len(shape) == 2 and all(_is_int(s) for s in shape)):
            raise VerificationError(mf, f"captures[{pos}].shape", "[rows, hidden]", shape)
        if shape[0] != suite.n_ctx - 1:
            raise VerificationError(mf, f"captures[{pos}].shape rows (context_length - 1)", suite.n_ctx - 1, shape[0])
        hashes[idx] = sha
        shapes.add(tuple(shape))
    if doc.get("contexts") != len(hashes):
        raise VerificationError(mf, "contexts (the records of captures)", len(hashes), doc.get("contexts"))
    if len(shapes) != 1:
        raise VerificationError(mf, "shape of every capture", "one shape", sorted(shapes))
    ordered = sorted(hashes)
    rows = suite.meta.get("published_token_sha256")
    if isinstance(rows, list):
        want = published_digest([rows[i] for i in ordered])
        if doc.get("suite_token_sha256") != want:
            raise VerificationError(mf, "suite_token_sha256 (the published digest of the contexts it holds)", want,
                                    doc.get("suite_token_sha256"), "this capture was made over other tokens")
    for idx in ordered:
        if not (folder / hidden_filename(idx)).is_file():
            raise VerificationError(folder / hidden_filename(idx), "listed capture file", "present", "missing")
    listed = {hidden_filename(i) for i in ordered}
    extra = sorted(p.name for p in folder.iterdir() if HIDDEN_RE.match(p.name) and p.name not in listed)
    if extra:
        raise VerificationError(folder / extra[0], "capture file not listed in capture-manifest.json", "none", extra[:5])
    width = next(iter(shapes))[1]
    return doc, hashes, int(width)


@dataclass
class PublishedStore(CaptureStore):
    """Hidden states of published capture folders under ``root``, verified as docs/interchange.md §"Capture folders" says.

    custody: per folder (relative to ``root``), the sha256 of its ``capture-manifest.json`` and the
    ``suite_token_sha256`` it declares.
    """

    custody: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open_folders(cls, root: Path, folders: list[Path], suite: Suite, name: str) -> PublishedStore:
        """One store over ``folders`` (each inside ``root``)."""
        files: dict[int, str] = {}
        hashes: dict[int, str] = {}
        custody: dict[str, Any] = {}
        identity: dict[str, Any] | None = None
        widths: set[int] = set()
        for folder in folders:
            doc, got, width = read_folder(folder, suite)
            rel = folder.relative_to(root).as_posix()
            ident = published_identity(doc, name)
            if identity is not None and ident["published"] != identity["published"]:
                raise VerificationError(folder / CAPTURE_MANIFEST, "candidate_identity (the other folders' of this store)",
                                        identity["published"], ident["published"])
            identity = ident
            widths.add(width)
            for idx, sha in got.items():
                if idx in files:
                    raise VerificationError(folder / CAPTURE_MANIFEST, f"context {idx}", "in one folder only", f"also in {files[idx]}")
                files[idx] = f"{rel}/{hidden_filename(idx)}" if rel != "." else hidden_filename(idx)
                hashes[idx] = sha
            custody[rel] = {"capture_manifest_sha256": sha256_file(folder / CAPTURE_MANIFEST),
                            "suite_token_sha256": doc.get("suite_token_sha256"), "contexts": len(got)}
        if len(widths) != 1 or identity is None:
            raise VerificationError(root, "hidden size of every capture folder", "one", sorted(widths))
        manifest: StoreManifest = {"schema": CAPTURE_SCHEMA, "kind": "hidden_states", "dtype": "bfloat16", "hidden_size": widths.pop(),
                    "suite_token_sha256": suite.suite_token_sha256, "n_ctx": suite.n_ctx, "model": identity,
                    "engine": {"name": "published capture", "layout": LAYOUT}, "runtime": None, "device": None}
        return cls(root=root, suite=suite, manifest=manifest, files=files, hashes=hashes, verify=True, custody=custody)

    def load(self, index: int) -> torch.Tensor:
        """The verified ``hidden_states`` of context ``index`` (``[n_ctx - 1, hidden]`` bf16)."""
        import torch
        from safetensors import SafetensorError
        from safetensors.torch import load as st_load

        path = self._path(index)
        try:
            data = path.read_bytes()
            if index not in self._verified:
                digest = sha256_bytes(data)
                if digest != self.hashes[index]:
                    raise VerificationError(path, "sha256 (capture-manifest.json)", self.hashes[index], digest)
            tensors = st_load(data)
        except SafetensorError as e:
            raise corrupt(path, e) from None
        if sorted(tensors) != [HIDDEN_TENSOR]:
            raise VerificationError(path, "tensor names", [HIDDEN_TENSOR], sorted(tensors))
        t = tensors[HIDDEN_TENSOR]
        if t.dtype != torch.bfloat16:
            raise VerificationError(path, f"{HIDDEN_TENSOR} dtype", "torch.bfloat16", t.dtype)
        if tuple(t.shape) != self.shape:
            raise VerificationError(path, f"{HIDDEN_TENSOR} shape", list(self.shape), list(t.shape))
        if not bool(torch.isfinite(t).all()):
            raise VerificationError(path, f"{HIDDEN_TENSOR} values", "all finite", "NaN/Inf")
        self._verified.add(index)
        return t
