"""Content hashes used for identities (sha256, hex)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of a byte string."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's content (``hashlib.file_digest``: read in chunks, never whole)."""
    return file_hexdigest(path)


def file_hexdigest(path: str | Path, algorithm: str = "sha256", prefix: bytes = b"") -> str:
    """Hex digest of ``prefix`` followed by a file's content, read in chunks (never whole): the one file
    hash of the package (``sha1`` with a ``blob <size>\\0`` prefix is Git's blob name, not a security use)."""
    h = hashlib.new(algorithm, usedforsecurity=algorithm != "sha1")
    h.update(prefix)
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, lambda: h).hexdigest()


def tokens_sha256(tokens: np.ndarray) -> str:
    """sha256 of a token array as little-endian uint32 in row-major (context) order.

    This is the protocol's ``suite_token_sha256`` (over all contexts) and a shard's
    ``sha256`` (over its rows).
    """
    arr = np.ascontiguousarray(np.asarray(tokens), dtype="<u4")
    return hashlib.sha256(arr.tobytes()).hexdigest()
