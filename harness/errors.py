"""Error types. Every error names the file, what was expected and what was found."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class FidelityError(Exception):
    """Base class of every error the harness raises on purpose (bad input, bad usage)."""


class VerificationError(FidelityError):
    """An input failed verification (fail-closed rule, docs/design.md, section 4).

    The message reads ``<file>: <what>: expected <expected>, found <found>`` plus an optional hint.
    """

    def __init__(
        self,
        path: str | Path,
        what: str,
        expected: Any = None,
        found: Any = None,
        hint: str | None = None,
    ) -> None:
        self.path = str(path)
        self.what = what
        self.expected = expected
        self.found = found
        self.hint = hint
        msg = f"{self.path}: {what}"
        if expected is not None or found is not None:
            msg += f": expected {expected}, found {found}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class OutputError(FidelityError):
    """An output could not be written (disk full, read-only folder, permission denied), or would
    overwrite something it must not (an input of the same command, an existing store).

    Nothing partial is left behind: the message names the file and the operating system's reason.
    """

    def __init__(self, path: str | Path, what: str, reason: str) -> None:
        self.path = str(path)
        self.what = what
        self.reason = reason
        super().__init__(f"{self.path}: {what}: {reason}")
