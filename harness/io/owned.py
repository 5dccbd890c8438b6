"""Removing files: only what is provably the harness's own.

Every deletion goes through :func:`owned_file`: a path relative to a base folder, no symbolic link on the
way, a regular file; what proves the file the harness's own (a ledger's sha256, a signature) is the caller's.

Reasoning: docs/design.md §"Removing files".
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from harness.errors import VerificationError


def check_relative(rel: str, listed_in: str | Path, what: str) -> None:
    """Refuse ``rel`` unless it is a plain relative path below its base (docs/design.md §"Removing files")."""
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
    there. Anything else there (a link on the way, a folder, a device) is refused (docs/design.md §"Removing files")."""
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
