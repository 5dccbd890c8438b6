"""Writes that cannot half-happen (docs/design.md, section 4).

Reasoning: docs/design.md §"Atomic writes".
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from harness.errors import FidelityError, OutputError, VerificationError
from harness.io.jsonio import read_json
from harness.io.owned import check_relative, owned_file, symlink_on_path

_P = TypeVar("_P", str, Path)


def _umask() -> int:
    """The process umask (read without changing it where /proc allows; else set and restore)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def file_mode() -> int:
    """Mode of a newly written file: ``0o666`` less the umask (what ``open(path, "w")`` gives)."""
    return 0o666 & ~_umask()


def _reason(e: OSError) -> str:
    return f"{type(e).__name__}: {e.strerror or e}"


def _mkdir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(folder, "cannot create the folder", _reason(e)) from None


@contextmanager
def _staging(path: Path) -> Iterator[tuple[BinaryIO, str]]:
    """A temporary file next to ``path`` (final mode) and its name; fsynced when the block ends, removed
    when the block raises. An operating-system error of these steps is an OutputError naming ``path``."""
    _mkdir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OutputError(path, "cannot write", _reason(e)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), file_mode())
            yield fh, tmp
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as e:
        _unlink(tmp)
        raise OutputError(path, "cannot write", _reason(e)) from None
    except BaseException:
        _unlink(tmp)
        raise


def _stage(path: Path, data: bytes) -> str:
    """Write ``data`` to a temporary file next to ``path`` (fsynced, final mode); return its name."""
    with _staging(path) as (fh, tmp):
        fh.write(data)
    return tmp


@contextmanager
def atomic_writer(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file written in pieces that appears at ``path`` whole, or not at all: the block writes
    to a temporary file in the same folder, which is fsynced and renamed into place when the block
    ends; when the block raises, the temporary file is removed and ``path`` is left as it was."""
    final = Path(path)
    with _staging(final) as (fh, tmp):
        yield fh
    try:
        os.replace(tmp, final)
    except OSError as e:
        _unlink(tmp)
        raise OutputError(final, "cannot write", _reason(e)) from None


def _unlink(p: str | Path) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (same-folder temp file + rename)."""
    atomic_write_files({Path(path): data})


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write UTF-8 text atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_files(files: Mapping[_P, bytes | str]) -> list[Path]:
    """Write several files as one unit: all staged first, then all renamed (docs/design.md §"Atomic writes")."""
    items = [(Path(p), d.encode("utf-8") if isinstance(d, str) else d) for p, d in files.items()]
    for folder in sorted({p.parent for p, _d in items}):
        finish_pending(folder)  # a killed earlier write into this folder is completed first
    staged: list[tuple[Path, str]] = []
    try:
        for path, data in items:
            staged.append((path, _stage(path, data)))
    except BaseException:
        for _p, tmp in staged:
            _unlink(tmp)
        raise
    journal = _write_journal(staged) if len(staged) > 1 else None
    created: list[Path] = []
    try:
        for i, (path, tmp) in enumerate(staged):
            existed = path.exists()
            try:
                os.replace(tmp, path)
            except OSError as e:
                for _p, t in staged[i:]:
                    _unlink(t)
                for c in created:
                    _unlink(c)
                raise OutputError(path, "cannot write", _reason(e)) from None
            if not existed:
                created.append(path)
    except BaseException:
        for _p, t in staged:
            _unlink(t)
        if journal is not None:
            _unlink(journal)
        raise
    if journal is not None:
        _unlink(journal)
    return [p for p, _d in items]


#: The journal of one multi-file write: ``{"schema", "renames": [[staged, final], ...]}``, paths relative
#: to the journal's folder.
JOURNAL_SCHEMA = "fidelity.pending-renames/1"
_JOURNAL = re.compile(r"^\.fidelity-pending\.[A-Za-z0-9_]+\.json$")


def _write_journal(staged: list[tuple[Path, str]]) -> str:
    """Record the renames about to happen (fsynced) in the files' common folder; returns its path."""
    folder = Path(os.path.commonpath([str(p.parent.absolute()) for p, _t in staged]))
    renames = [[Path(os.path.relpath(Path(t).absolute(), folder)).as_posix(), Path(os.path.relpath(p.absolute(), folder)).as_posix()]
               for p, t in staged]
    data = json.dumps({"schema": JOURNAL_SCHEMA, "renames": renames}, sort_keys=True).encode("utf-8")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".fidelity-pending.", suffix=".json", dir=folder)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as e:
        for _p, t in staged:
            _unlink(t)
        raise OutputError(staged[0][0], "cannot write", _reason(e)) from None
    return tmp


def finish_pending(folder: str | Path) -> list[Path]:
    """Complete the multi-file writes a killed process left half-renamed in ``folder`` (module
    docstring); returns the files put in place. A journal is followed only where it renames a staged
    file of this module (``.<name>.<random>.tmp``) to ``<name>`` beside it, both reached without a
    symbolic link; any other journal is a :class:`~harness.errors.VerificationError` naming it."""
    folder = Path(folder)
    done: list[Path] = []
    if not folder.is_dir() or folder.is_symlink():
        return done
    for journal in sorted(p for p in folder.iterdir() if _JOURNAL.match(p.name)):
        if journal.is_symlink() or not journal.is_file():
            raise VerificationError(journal, "pending-renames journal", "a regular file", "a symbolic link or another entry")
        doc = read_json(journal)
        renames = doc.get("renames")
        if doc.get("schema") != JOURNAL_SCHEMA or not isinstance(renames, list):
            raise VerificationError(journal, "schema", JOURNAL_SCHEMA, doc.get("schema"))
        moves = []
        for i, pair in enumerate(renames):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise VerificationError(journal, f"renames[{i}]", "[staged path, final path]", pair)
            tmp_rel, final_rel = pair
            check_relative(final_rel, journal, f"renames[{i}]")
            staged_name = Path(tmp_rel).name
            m = _STAGED.match(staged_name)
            if m is None or m.group(1) != Path(final_rel).name or Path(tmp_rel).parent != Path(final_rel).parent:
                raise VerificationError(journal, f"renames[{i}]", "a staged .<name>.<random>.tmp beside <name>", pair)
            link = symlink_on_path(folder, final_rel)
            if link is not None:
                raise VerificationError(journal, f"renames[{i}]", "a path without a symbolic link", f"{link} is one")
            tmp = owned_file(folder, tmp_rel, journal, f"renames[{i}]")
            if tmp is not None:
                moves.append((tmp, folder / final_rel))
        for tmp, final in moves:
            try:
                os.replace(tmp, final)
            except OSError as e:
                raise OutputError(final, "cannot complete an interrupted write", _reason(e)) from None
            done.append(final)
        journal.unlink()
    return done


#: A file staged by :func:`_stage`: ``.<final name>.<random>.tmp``.
_STAGED = re.compile(r"^\.(.+)\.[A-Za-z0-9_]{8}\.tmp$")


@contextmanager
def staged_directory(final: str | Path) -> Iterator[Path]:
    """Build a folder under a temporary sibling name; on success rename it to ``final`` in one step.

    ``final`` must not exist, or be an empty folder. On any error the staging folder is removed
    and ``final`` is left as it was.
    """
    final = Path(final)
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise OutputError(final, "output folder", "exists and is not empty (a published set is written whole)")
    _mkdir(final.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".staging", dir=final.parent))
    except OSError as e:
        raise OutputError(final, "cannot create the folder", _reason(e)) from None
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        try:
            if final.is_dir():
                final.rmdir()
            os.replace(tmp, final)
        except OSError as e:
            raise OutputError(final, "cannot move the staged folder into place", _reason(e)) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def refuse_overwriting_inputs(outputs: Iterable[str | Path], inputs: Iterable[str | Path], command: str) -> None:
    """Refuse an output that is one of the command's inputs or lies inside an input folder
    (a store, a suite): ``fidelity replay --out`` may never replace a ``capture.json``."""
    ins = [(Path(p).resolve(), Path(p).is_dir()) for p in inputs]
    for out in outputs:
        o = Path(out).resolve()
        for i, is_dir in ins:
            if o == i or (is_dir and o.is_relative_to(i)):
                raise OutputError(out, f"{command} output", f"it would overwrite or write inside its own input {i}")


@contextmanager
def removed_on_failure(*paths: str | Path) -> Iterator[None]:
    """Outputs a command is about to create: those absent when it starts are removed (with everything the
    command wrote in them) when it is refused (a :class:`~harness.errors.FidelityError`) or fails on an
    operating-system error. What existed before (a store being resumed, a user's folder) is never removed;
    an interrupt (Ctrl-C) keeps a resumable capture."""
    absent = [Path(p) for p in paths if not os.path.lexists(p)]
    try:
        yield
    except (FidelityError, OSError):
        for p in absent:
            if p.is_symlink() or not p.exists():
                continue  # a link is never this command's output
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                _unlink(p)
        raise


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
