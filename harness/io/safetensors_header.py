"""The one reader of safetensors headers: tensor names, dtypes, shapes, byte sizes and ``__metadata__``.

A file on disk is opened with safetensors' own ``safe_open`` (its header, offsets and length checked
by the library, no tensor read); bytes already in memory (a file read whole to be hashed) are parsed
here under the same limit. Either way a bad file is one :class:`~harness.errors.VerificationError`,
``<file>: corrupt or truncated safetensors (<reason>)``. ``tests/test_static.py`` fails on a second
parser of the 8-byte header length anywhere else in ``harness/``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open

from harness.errors import VerificationError

#: The largest header accepted, in bytes: safetensors' own limit (its reader refuses a longer one).
MAX_HEADER_BYTES = 100_000_000

#: Bits per element of each safetensors dtype (sub-byte float types pack several per byte).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "I64": 64, "U64": 64,
    "F64": 64,
}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a header: safetensors dtype name (``BF16``), shape, and stored bytes."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Header:
    """A safetensors header: its tensors by name (in file order) and its ``__metadata__`` strings."""

    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]


def corrupt(path: str | Path, reason: object) -> VerificationError:
    """The one error for a safetensors file that cannot be read."""
    return VerificationError(path, f"corrupt or truncated safetensors ({reason})")


def _nbytes(path: str | Path, name: str, dtype: str, shape: tuple[int, ...]) -> int:
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise corrupt(path, f"tensor {name!r}: unknown dtype {dtype!r}")
    return math.prod(shape) * bits // 8


def read_header(path: str | Path) -> Header:
    """The header of a safetensors file on disk, through ``safe_open`` (no tensor is read)."""
    try:
        with safe_open(str(path), framework="numpy") as fh:
            metadata = dict(fh.metadata() or {})
            tensors = {}
            for name in fh.keys():
                sl = fh.get_slice(name)
                dtype, shape = str(sl.get_dtype()), tuple(int(d) for d in sl.get_shape())
                tensors[name] = TensorEntry(dtype, shape, _nbytes(path, name, dtype, shape))
    except (SafetensorError, OSError) as e:
        raise corrupt(path, e) from None
    return Header(tensors, metadata)


def parse_header(data: bytes, path: str | Path) -> Header:
    """The header of a safetensors file already in memory (``data``: the whole file, or at least its header)."""
    if len(data) < 8:
        raise corrupt(path, f"{len(data)} bytes, shorter than the 8-byte header length")
    n = int.from_bytes(data[:8], "little")
    if not 0 < n <= MAX_HEADER_BYTES or 8 + n > len(data):
        raise corrupt(path, f"header length {n} (at most {MAX_HEADER_BYTES}, within {len(data) - 8} bytes)")
    try:
        head = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, ValueError) as e:
        raise corrupt(path, f"header is not JSON: {e}") from None
    if not isinstance(head, dict):
        raise corrupt(path, f"header is a {type(head).__name__}, not an object")
    raw_meta = head.pop("__metadata__", None) or {}
    if not isinstance(raw_meta, dict) or not all(isinstance(v, str) for v in raw_meta.values()):
        raise corrupt(path, "__metadata__ is not an object of strings")
    tensors = {}
    for name, spec in head.items():
        dtype = spec.get("dtype") if isinstance(spec, dict) else None
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if not (isinstance(dtype, str) and isinstance(shape, list)
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise corrupt(path, f"tensor {name!r}: expected a dtype and a shape, found {spec!r}")
        tensors[name] = TensorEntry(dtype, tuple(shape), _nbytes(path, name, dtype, tuple(shape)))
    return Header(tensors, dict(raw_meta))
