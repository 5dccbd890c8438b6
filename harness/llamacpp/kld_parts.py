"""A ``.kld`` file published split into parts, read in order without being joined on disk.

Reasoning: docs/llamacpp.md §"Files in parts".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import FidelityError, VerificationError
from harness.io.atomic import atomic_write_bytes, atomic_write_json
from harness.io.jsonio import read_json
from harness.io.schema import Closed, OneOf, check

SCHEMA = "fidelity.kld-parts/1"
SUFFIX = ".parts.json"
_CHUNK = 1 << 20


def is_parts_manifest(path: Path) -> bool:
    """True for a ``*.kld.parts.json`` manifest path."""
    return path.name.endswith(SUFFIX)


@dataclass(frozen=True)
class PartedFile:
    """The parts of one file, in order, with their byte counts (verified against the manifest)."""

    manifest: Path
    name: str
    parts: tuple[Path, ...]
    sizes: tuple[int, ...]
    sha256: str | None
    part_sha256: tuple[str | None, ...]

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def read(self, offset: int, n: int) -> bytes:
        """``n`` bytes from ``offset`` of the whole file, read from the parts that hold them."""
        out = bytearray()
        start = 0
        for part, size in zip(self.parts, self.sizes):
            end = start + size
            if offset < end and offset + n > start:
                lo = max(offset, start) - start
                hi = min(offset + n, end) - start
                with open(part, "rb") as fh:
                    fh.seek(lo)
                    out += fh.read(hi - lo)
            start = end
        if len(out) != n:
            raise VerificationError(self.manifest, f"bytes {offset}..{offset + n} of {self.name}", n, len(out), "a part is short")
        return bytes(out)

    def stream(self) -> Iterator[tuple[Path, bytes]]:
        """Every part's bytes in order, in 1 MiB blocks, with the part they come from."""
        for part in self.parts:
            with open(part, "rb") as fh:
                while block := fh.read(_CHUNK):
                    yield part, block


#: The manifest as the harness reads it (harness.io.schema): closed, this version, every digest present.
MANIFEST_SCHEMA = Closed({"schema": OneOf(SCHEMA), "file": str, "bytes": int, "sha256": str,
                          "parts": [Closed({"name": str, "bytes": int, "sha256": str})]})
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _digest(manifest: Path, where: str, value: str) -> str:
    if not _HEX64.match(value):
        raise VerificationError(manifest, where, "64 lower-case hex digits", repr(value))
    return value


def open_parts(manifest: Path) -> PartedFile:
    """Read a parts manifest (:data:`MANIFEST_SCHEMA`) and check every part's presence and byte count (module
    docstring): each part a regular file in the manifest's folder (not a link out of it), listed once."""
    doc: dict[str, Any] = read_json(manifest)
    check(doc, MANIFEST_SCHEMA, manifest)
    entries = doc["parts"]
    if not entries:
        raise VerificationError(manifest, "parts", "a non-empty list of {name, bytes, sha256}", "an empty list")
    whole = _digest(manifest, "sha256", doc["sha256"])
    folder = manifest.parent.resolve()
    parts, sizes, shas, seen = [], [], [], set()
    for i, e in enumerate(entries):
        name = e["name"]
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise VerificationError(manifest, f"parts[{i}].name", "a plain file name beside the manifest", name)
        if name in seen:
            raise VerificationError(manifest, f"parts[{i}].name", "each part once", f"{name} listed again")
        seen.add(name)
        want = e["bytes"]
        if want < 0:
            raise VerificationError(manifest, f"parts[{i}].bytes", "an integer >= 0", want)
        shas.append(_digest(manifest, f"parts[{i}].sha256", e["sha256"]))
        p = manifest.parent / name
        if p.is_symlink() and p.resolve().parent != folder:
            raise VerificationError(p, f"part of {doc['file']}", f"a file in {folder}", f"a symbolic link to {p.resolve()}")
        if not p.is_file():
            raise VerificationError(p, f"part of {doc['file']}", "present", "missing")
        if p.stat().st_size != want:
            raise VerificationError(p, "byte count (the manifest's)", want, p.stat().st_size, "a truncated or wrong part")
        parts.append(p)
        sizes.append(want)
    total = doc["bytes"]
    if total != sum(sizes):
        raise VerificationError(manifest, "bytes (the sum of the parts)", sum(sizes), total)
    return PartedFile(manifest, doc["file"], tuple(parts), tuple(sizes), whole, tuple(shas))


def parts_sha256(pf: PartedFile) -> str:
    """sha256 of the whole file, from its parts in order; each part's and the whole's checked against the manifest."""
    whole = hashlib.sha256()
    current: Path | None = None
    part_hash = hashlib.sha256()

    def close(part: Path | None) -> None:
        if part is None:
            return
        want = pf.part_sha256[pf.parts.index(part)]
        if want is not None and part_hash.hexdigest() != want:
            raise VerificationError(part, "sha256 (the parts manifest's)", want, part_hash.hexdigest())

    for part, block in pf.stream():
        if part != current:
            close(current)
            current, part_hash = part, hashlib.sha256()
        part_hash.update(block)
        whole.update(block)
    close(current)
    if pf.sha256 is not None and whole.hexdigest() != pf.sha256:
        raise VerificationError(pf.manifest, f"sha256 of {pf.name} (its parts in order)", pf.sha256, whole.hexdigest())
    return whole.hexdigest()


class ChunkRows:
    """The ``[n_chunk, rows, width]`` uint16 rows of a parted ``.kld``, one chunk per positioned read."""

    def __init__(self, pf: PartedFile, offset: int, shape: tuple[int, int, int]) -> None:
        self.pf, self.offset, self.shape = pf, offset, shape

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, chunk: int) -> np.ndarray:
        n_chunk, rows, width = self.shape
        if not 0 <= chunk < n_chunk:
            raise IndexError(f"chunk {chunk} of {n_chunk}")
        size = rows * width * 2
        data = self.pf.read(self.offset + chunk * size, size)
        return np.frombuffer(data, dtype="<u2").reshape(rows, width)


def split_file(path: Path, out: Path, part_bytes: int) -> Path:
    """Split ``path`` into ``out/<name>.part-NNN`` of ``part_bytes`` each and write the manifest; returns it."""
    if part_bytes <= 0:
        raise FidelityError(f"part size: expected a positive number of bytes, found {part_bytes}")
    data_hash = hashlib.sha256()
    entries = []
    with open(path, "rb") as fh:
        k = 0
        while block := fh.read(part_bytes):
            name = f"{path.name}.part-{k:03d}"
            atomic_write_bytes(out / name, block)
            entries.append({"name": name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
            data_hash.update(block)
            k += 1
    manifest = out / f"{path.name}{SUFFIX}"
    atomic_write_json(manifest, {"schema": SCHEMA, "file": path.name, "bytes": path.stat().st_size,
                                 "sha256": data_hash.hexdigest(), "parts": entries})
    return manifest
