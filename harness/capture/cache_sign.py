"""The capture cache's signature: a cached store is believed only when this user's harness wrote it.

A live candidate's capture lands in the cache folder (``[settings] cache_dir``), keyed by the model's
identity. Anyone who can write there could plant a store with the right identity and self-consistent
sha256s but made-up numbers, so every manifest (``capture.json``) the harness writes *into the cache*
carries ``cache_signature``: an HMAC-SHA256, under a per-user key kept outside the cache, over the
manifest's other fields (which list every context file's sha256, so the signature covers every byte of
the store). A cached store whose signature is missing or made with another key is not believed: it is
captured again in place (the cache is only a cache).

Reasoning: docs/design.md §"The capture cache's signature".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from harness.errors import FidelityError

#: Environment variable naming the key file.
ENV = "FIDELITY_CACHE_KEY"
#: The manifest field holding the signature.
FIELD = "cache_signature"
ALG = "hmac-sha256"
KEY_BYTES = 32
_DOMAIN = b"fidelity.capture-cache/1\n"


class UntrustedCacheWarning(UserWarning):
    """A cached store that is not believed (no valid signature): named, and captured again."""


def key_path() -> Path:
    """Where this user's cache key lives (docs/design.md §"The capture cache's signature")."""
    env = os.environ.get(ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "fidelity" / "cache-key"


def _create(path: Path) -> None:
    """Write a fresh key at ``path`` unless one is there: staged 0600, then hard-linked into place
    (fails when another process won the race, whose key is then the one read)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    except OSError as e:
        raise FidelityError(f"{path}: cannot create the capture cache key ({type(e).__name__}: {e.strerror or e}); "
                            f"set {ENV} to a file path this user can write, outside the cache folder") from None


def load_key(cache_dir: Path | None = None) -> bytes:
    """This user's cache key, created on first use; ``cache_dir``: the cache folder it must not be inside."""
    path = key_path()
    if cache_dir is not None and path.resolve().is_relative_to(Path(cache_dir).resolve()):
        raise FidelityError(f"{path}: the capture cache key must be kept outside the cache folder {cache_dir} "
                            f"(whoever can write the cache could read or replace it): set {ENV} to another path")
    if not path.exists():
        _create(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise FidelityError(f"{path}: capture cache key: expected a regular file, found another kind of entry")
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise FidelityError(f"{path}: capture cache key: expected a file owned by this user with mode 0600, found "
                                f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o} (chmod 600 it, or remove it "
                                "to get a new key: the cache is then captured again)")
        key = path.read_bytes()
    except OSError as e:
        raise FidelityError(f"{path}: cannot read the capture cache key ({type(e).__name__}: {e.strerror or e})") from None
    if len(key) != KEY_BYTES:
        raise FidelityError(f"{path}: capture cache key: expected {KEY_BYTES} bytes, found {len(key)} "
                            "(remove it to get a new key: the cache is then captured again)")
    return key


def _mac(doc: Mapping[str, object], key: bytes) -> str:
    body = {k: v for k, v in doc.items() if k != FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hmac.new(key, _DOMAIN + text.encode("ascii"), hashlib.sha256).hexdigest()


def sign(doc: Mapping[str, object], key: bytes) -> dict[str, object]:
    """``doc`` with its ``cache_signature`` under ``key`` (any previous one replaced)."""
    return {**{k: v for k, v in doc.items() if k != FIELD}, FIELD: {"alg": ALG, "mac": _mac(doc, key)}}


def unsigned_reason(doc: Mapping[str, object], key: bytes) -> str | None:
    """None when ``doc`` carries a valid signature under ``key``; else why it does not (one phrase)."""
    sig = doc.get(FIELD)
    if sig is None:
        return "no cache signature (written by another user's harness, an earlier version, or by hand)"
    if not isinstance(sig, dict) or sig.get("alg") != ALG or not isinstance(sig.get("mac"), str) or not sig["mac"].isascii():
        return f"a malformed cache signature (expected {{alg: {ALG!r}, mac: hex}}, found {sig!r:.80})"
    try:
        want = _mac(doc, key)
    except (ValueError, TypeError):
        return "a manifest that is not plain JSON (NaN/Infinity or odd values), so it cannot be signed"
    if not hmac.compare_digest(sig["mac"], want):
        return f"a cache signature made with another key or over other content (this user's key: {key_path()})"
    return None
