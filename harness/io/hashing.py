"""Content hashes used for identities (sha256, hex)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
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


def files_sha256(paths: Iterable[str | Path], root: str | Path | None = None) -> str:
    """One sha256 over several files: each file's :func:`sha256_file`, preceded by its name relative to
    ``root`` when given (then a renamed file is another digest), joined in the order given."""
    base = Path(root) if root is not None else None
    parts = [(Path(f).relative_to(base).as_posix() if base is not None else "") + "\0" + sha256_file(f)
             for f in paths]
    return sha256_bytes("\0".join(parts).encode())


def tokens_sha256(tokens: np.ndarray) -> str:
    """sha256 of a token array as little-endian uint32 in row-major (context) order.

    This is the protocol's ``suite_token_sha256`` (over all contexts) and a shard's
    ``sha256`` (over its rows).
    """
    arr = np.ascontiguousarray(np.asarray(tokens), dtype="<u4")
    return hashlib.sha256(arr.tobytes()).hexdigest()


def content_sha256(value: object) -> str:
    """sha256 of ``value``: JSON-able data as canonical JSON, numpy arrays by dtype, shape and bytes (anywhere
    inside lists, tuples and dicts), objects with a ``__dict__`` by their fields."""
    h = hashlib.sha256()

    def walk(v: object) -> None:
        if isinstance(v, np.ndarray):
            a = np.ascontiguousarray(v)
            h.update(f"\0array\0{a.dtype.str}\0{a.shape}\0".encode())
            h.update(a.tobytes())
        elif isinstance(v, dict):
            h.update(b"\0{")
            for k in sorted(v, key=str):
                h.update(json.dumps(str(k)).encode())
                walk(v[k])
            h.update(b"}")
        elif isinstance(v, (list, tuple)):
            h.update(b"\0[")
            for x in v:
                walk(x)
            h.update(b"]")
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            h.update(f"\0{type(v).__name__}".encode())
            walk(vars(v))
        else:
            h.update(b"\0" + json.dumps(v, default=repr).encode())

    walk(value)
    return h.hexdigest()
