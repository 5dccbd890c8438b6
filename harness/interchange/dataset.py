"""A published dataset opened whole: suite, shard views, pin, shared head and reference, all verified.

Beyond the suite (:mod:`harness.interchange.suite_manifest`) and the capture folders
(:mod:`harness.interchange.capture_dir`), refused here:

* ``suite/ladder-pin.json`` missing, or without a 64-hex ``head_sha256``;
* a head whose sha256 is not the pinned one; a head file holding other than one 2-D bf16 finite
  tensor (its key may be anything); a head whose vocabulary is below the suite's largest token id;
* a reference whose hidden size is not the head's, or whose folders cover part of a shard only.

:attr:`PublishedDataset.custody` is the record of every published digest the run was verified
against; it goes into every report's comparability block, so a report names the exact dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import VerificationError
from harness.inputs.head import HeadTensor
from harness.inputs.interchange_layout import (
    CAPTURE_MANIFEST,
    HEX64_RE,
    LADDER_PIN,
    LAYOUT,
    SUITE_DIR,
    LayoutScan,
    reference_folders,
)
from harness.inputs.suite import Suite
from harness.interchange.capture_dir import PublishedStore
from harness.interchange.suite_manifest import PublishedSuite, load_published_suite
from harness.io.hashing import sha256_file
from harness.io.jsonio import read_json
from harness.io.safetensors_header import corrupt


def load_single_tensor_head(path: Path, pinned_sha256: str, source_model: dict[str, Any] | None) -> HeadTensor:
    """The shared head: one 2-D bf16 finite tensor, whatever its key, whose file sha256 is ``pinned_sha256``."""
    import torch
    from safetensors import SafetensorError, safe_open

    digest = sha256_file(path)
    if digest != pinned_sha256:
        raise VerificationError(path, f"sha256 (the head pinned by {SUITE_DIR}/{LADDER_PIN})", pinned_sha256, digest,
                                "this is not the head the dataset's reports were scored with")
    try:
        with safe_open(str(path), framework="pt") as fh:
            keys = list(fh.keys())
            if len(keys) != 1:
                raise VerificationError(path, "tensors in the head file", "exactly one", keys)
            w = fh.get_tensor(keys[0])
    except SafetensorError as e:
        raise corrupt(path, e) from None
    if w.ndim != 2 or w.dtype != torch.bfloat16:
        raise VerificationError(path, "head tensor", "2-D torch.bfloat16 [vocab, hidden]", f"{w.ndim}-D {w.dtype}")
    if not bool(torch.isfinite(w).all()):
        raise VerificationError(path, "head values", "all finite", "NaN/Inf")
    return HeadTensor(w, digest, path, source_model)


@dataclass(frozen=True)
class PublishedDataset:
    """A verified published dataset (module docstring)."""

    root: Path
    published_suite: PublishedSuite
    reference: PublishedStore
    head: HeadTensor
    reference_shards: tuple[int, ...]
    pin: dict[str, Any]
    custody: dict[str, Any]

    @property
    def suite(self) -> Suite:
        return self.published_suite.suite

    def capture_store(self, folder: Path, name: str) -> PublishedStore:
        """A published candidate capture folder (``captures/shard-NNNN/hidden-<name>``, or any such folder) as a store."""
        folders = sorted(p.parent for p in folder.rglob(CAPTURE_MANIFEST)) if not (folder / CAPTURE_MANIFEST).is_file() else [folder]
        if not folders:
            raise VerificationError(folder / CAPTURE_MANIFEST, "capture manifest", "present", "missing")
        return PublishedStore.open_folders(folder, folders, self.suite, name)


def open_published(scan: LayoutScan) -> PublishedDataset:
    """Verify the dataset ``scan`` names, whole, and open it (module docstring)."""
    psuite = load_published_suite(scan.suite)
    suite = psuite.suite
    pin_path = scan.suite / LADDER_PIN
    if not pin_path.is_file():
        raise VerificationError(pin_path, "ladder pin", "present (it pins the shared head)", "missing")
    pin = read_json(pin_path)
    pinned = pin.get("head_sha256")
    if not isinstance(pinned, str) or not HEX64_RE.match(pinned):
        raise VerificationError(pin_path, "head_sha256", "64 lowercase hex digits", pinned)
    reference = PublishedStore.open_folders(scan.reference, reference_folders(scan.root), suite, scan.reference_name)
    held = set(reference.indices)
    covered = tuple(k for k in range(suite.n_shards) if set(suite.shard_indices(k)) <= held)
    partial = sorted({k for k in range(suite.n_shards) if k not in covered and set(suite.shard_indices(k)) & held})
    if partial:
        have = len(set(suite.shard_indices(partial[0])) & held)
        raise VerificationError(scan.reference, f"reference contexts of shard {partial[0]}", f"all {suite.shard(partial[0]).n_contexts}",
                                have, "a reference covers whole shards")
    head = load_single_tensor_head(scan.head, pinned, reference.identity)
    if head.hidden_size != reference.width:
        raise VerificationError(scan.head, "head hidden_size (the reference's hidden size)", reference.width, head.hidden_size)
    if head.vocab_size < suite.vocab_size:
        raise VerificationError(scan.head, "head vocab_size (above every token id of the suite)", f">= {suite.vocab_size}", head.vocab_size)
    custody = {"layout": LAYOUT, **psuite.custody, "ladder_pin_sha256": sha256_file(pin_path), "head_sha256": pinned,
               "reference": reference.custody}
    return PublishedDataset(root=scan.root, published_suite=psuite, reference=reference, head=head,
                            reference_shards=covered, pin=pin, custody=custody)
