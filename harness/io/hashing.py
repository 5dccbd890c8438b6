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
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def tokens_sha256(tokens: np.ndarray) -> str:
    """sha256 of a token array as little-endian uint32 in row-major (context) order.

    This is the protocol's ``suite_token_sha256`` (over all contexts) and a shard's
    ``sha256`` (over its rows).
    """
    arr = np.ascontiguousarray(np.asarray(tokens), dtype="<u4")
    return hashlib.sha256(arr.tobytes()).hexdigest()
