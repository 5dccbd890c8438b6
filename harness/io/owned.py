"""Removing files: only what is provably the harness's own.

Every place the harness deletes a file (the report folder's previous summaries, a store's
interrupted writes, the workers' hand-over files) goes through :func:`owned_file`, which accepts a
path only when

* it is given relative to a base folder, as plain ``/``-separated names: no absolute path, no ``..``,
  no ``.``, no empty name, no backslash;
* no folder on the way from the base to it, and not the file itself, is a symbolic link (the base
  itself is the user's choice and is not checked);
* it is a regular file (not a folder, a device, a socket).

What the caller proves on top (a ledger's sha256, an embedded identity, a session's signature) is the
caller's. A path that fails is an :class:`~harness.errors.VerificationError` naming the file that
listed it, the entry, what was expected and what was found; nothing is deleted.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from harness.errors import VerificationError


def check_relative(rel: str, listed_in: str | Path, what: str) -> None:
    """Refuse ``rel`` unless it is a plain relative path below its base (module docstring)."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel or any(p in ("", ".", "..") for p in parts):
        raise VerificationError(listed_in, what, "a path relative to the folder, without '..', '.' or '\\'", repr(rel))


def symlink_on_path(base: Path, rel: str) -> Path | None:
    """The first entry below ``base`` on the way to ``base/rel`` (``rel`` included) that is a
    symbolic link, or None."""
    p = base
    for part in rel.split("/"):
        p = p / part
        if p.is_symlink():
            return p
    return None


def owned_file(base: Path, rel: str, listed_in: str | Path, what: str) -> Path | None:
    """``base/rel`` when it is a regular file reached without a symbolic link; None when nothing is
    there. Anything else there (a link on the way, a folder, a device) is refused (module docstring)."""
    check_relative(rel, listed_in, what)
    link = symlink_on_path(base, rel)
    if link is not None:
        raise VerificationError(listed_in, what, "a file reached without a symbolic link", f"{link} is a symbolic link")
    path = base / rel
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise VerificationError(listed_in, what, "a readable file", f"{path}: {type(e).__name__}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise VerificationError(listed_in, what, "a regular file", f"{path} is not a regular file")
    return path


def remove_empty_folder(folder: Path) -> bool:
    """Remove ``folder`` when it is a real (not linked) and empty folder; True when removed."""
    try:
        if folder.is_symlink() or not folder.is_dir() or any(folder.iterdir()):
            return False
        folder.rmdir()
    except OSError:
        return False
    return True
