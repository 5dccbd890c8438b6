"""Atomic file writes: a temporary file in the same folder, fsync, then ``os.replace``.

An interrupted run therefore never leaves a half-written file under the final name.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (same-folder temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write UTF-8 text atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def _reject_non_finite(obj: Any, where: str = "$") -> None:
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"non-finite number {obj!r} at {where}: JSON reports may not contain NaN or Inf")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _reject_non_finite(v, f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _reject_non_finite(v, f"{where}[{i}]")


def dumps_json(obj: Any) -> str:
    """Canonical JSON text: sorted keys, 2-space indent, no NaN/Inf (raises ``ValueError``)."""
    _reject_non_finite(obj)
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as canonical JSON atomically; refuses NaN/Inf."""
    atomic_write_text(path, dumps_json(obj))
