"""A cache of computed results across runs: one signed file per entry, found by what it was computed from.

General: a kind of result (scored positions, :mod:`harness.run.score_cache`; any other per-shard result)
names its folder under ``[settings] cache_dir`` and supplies a *binding* (JSON: every input that decides the
numbers) and its own ``read`` / ``write`` of one entry. An entry's file is
``<cache_dir>/<kind>/<stem>-<sha256 of the binding, 16 hex>.<suffix>``; its content is signed with this user's
capture cache key (:mod:`harness.capture.cache_sign`) and carries the binding, so ``read`` believes a file only
when both match: a forged, truncated, renamed or foreign entry is named in an :class:`UntrustedCacheWarning`,
computed again and replaced. A changed input is another binding, so another file: it is computed, never read.
Concurrent processes (pytest-xdist workers) computing one entry take a lock beside it; the second reads.
:func:`signed_json_cache` is the ``read`` / ``write`` of a JSON result (a shard's summary, a rendered plot).
docs/performance.md ("Reruns") lists what each kind is keyed by.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from filelock import FileLock

from harness.capture.cache_sign import UntrustedCacheWarning, sign, unsigned_reason
from harness.errors import FidelityError, VerificationError
from harness.io.atomic import atomic_write_bytes
from harness.io.hashing import sha256_bytes
from harness.io.jsonio import JSONObject, loads_json

_T = TypeVar("_T")


@dataclass
class ResultCache(Generic[_T]):
    """The entries of one kind of result in ``folder``, signed with ``key``. ``read(path, binding)`` returns the
    entry or raises :class:`~harness.errors.VerificationError` when it is not believed; ``write(path, value,
    binding)`` writes it atomically. ``reused`` / ``computed``: the stems read / computed by this process."""

    folder: Path
    key: bytes = field(repr=False)
    read: Callable[[Path, JSONObject], _T]
    write: Callable[[Path, _T, JSONObject], None]
    suffix: str = ".npz"
    reused: list[str] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)

    def path(self, stem: str, bound: JSONObject) -> Path:
        """The file of the entry ``stem`` computed from ``bound``."""
        if not stem or not all(c.isalnum() or c in "_.+-" for c in stem) or stem.startswith("."):
            raise FidelityError(f"{self.folder}: a cache entry's name: expected letters, digits and _.+-, found {stem!r}")
        text = json.dumps(bound, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return self.folder / f"{stem}-{sha256_bytes(text.encode('utf-8'))[:16]}{self.suffix}"

    def get(self, stem: str, bound: JSONObject, compute: Callable[[], _T]) -> _T:
        """The entry ``stem`` computed from exactly ``bound``: read when a believed file holds it, else
        ``compute()``d (under the entry's lock, so concurrent processes compute it once) and written."""
        target = self.path(stem, bound)
        self.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(target.with_name(f".{target.name}.lock")):
            if target.is_dir() and not target.is_symlink():
                raise FidelityError(f"{target}: a cache entry: expected a file, found a folder (remove it)")
            if target.exists() or target.is_symlink():
                if target.is_symlink() or not target.is_file():
                    reason = "not a regular file of this harness (a symbolic link or a special file)"
                else:
                    try:
                        value = self.read(target, bound)
                    except VerificationError as e:
                        reason = f"{e.what}: expected {e.expected}, found {e.found}"
                    else:
                        self.reused.append(stem)
                        return value
                warnings.warn(f"{target}: cached result not believed ({reason:.300}); computed again and replaced",
                              UntrustedCacheWarning, stacklevel=2)
                target.unlink()
            value = compute()
            self.write(target, value, bound)
            self.computed.append(stem)
            return value

    def entries(self) -> list[Path]:
        """The entry files in the folder now (any process's)."""
        return cache_entries(self.folder, self.suffix)


def cache_entries(folder: Path, suffix: str = ".npz") -> list[Path]:
    """The entry files of a cache folder now (none when it is missing or not a plain folder)."""
    if folder.is_symlink() or not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix == suffix and not p.name.startswith("."))


def signed_json_cache(folder: Path, key: bytes, protocol: str) -> ResultCache[JSONObject]:
    """A cache of JSON results in ``folder``: each entry one file ``{"protocol", "binding", "value",
    "cache_signature"}`` signed with ``key`` (:func:`harness.capture.cache_sign.sign`). Read back only when
    the signature, ``protocol`` and the binding all match; a value that is not plain JSON (NaN) is not kept."""

    def write(path: Path, value: JSONObject, bound: JSONObject) -> None:
        try:
            doc = sign({"protocol": protocol, "binding": bound, "value": value}, key)
            text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):  # not plain JSON: computed each run, never kept
            return
        atomic_write_bytes(path, text.encode("utf-8"))

    def read(path: Path, bound: JSONObject) -> JSONObject:
        try:
            doc = loads_json(path.read_text(encoding="utf-8"), path)
        except (OSError, UnicodeDecodeError, FidelityError) as e:
            raise VerificationError(path, "cached result", "a JSON object", f"{type(e).__name__}: {e}") from None
        why = unsigned_reason(doc, key)
        if why is not None:
            raise VerificationError(path, "cached result signature", "signed with this user's key", why)
        if doc.get("protocol") != protocol:
            raise VerificationError(path, "cached result protocol", protocol, repr(doc.get("protocol")))
        found = doc.get("binding")
        if found != bound:
            got = found if isinstance(found, dict) else {}
            diff = sorted(k for k in {*bound, *got} if bound.get(k) != got.get(k))
            raise VerificationError(path, f"cached result computed from ({', '.join(diff)})",
                                    {k: bound.get(k) for k in diff}, {k: got.get(k) for k in diff})
        value = doc.get("value")
        if not isinstance(value, dict):
            raise VerificationError(path, "cached result value", "a JSON object", type(value).__name__)
        return value

    return ResultCache(folder=Path(folder), key=key, read=read, write=write, suffix=".json")
