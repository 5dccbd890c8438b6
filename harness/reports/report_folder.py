"""Opening a report folder for writing: one rule for the pytest run and every ``fidelity`` command.

Before it computes anything, a writer (the pytest run's controller, ``fidelity ladder``,
``precision-floor``, ``layers``, ``attribute``, ``allocate``, ``aggregate``, ``paired``) checks the folder
(:func:`check_for_writing`): its ledger (:func:`harness.reports.report_dir.check_ledger`), the entries it
will write into reached without a symbolic link, and its stamp's suite, which must be the suite the
writer measures. A refusal names the stamp, the expected and the found value; nothing is written. After
writing (each writer writes its files atomically) the command records them in the folder's ledger
(:meth:`ReportFolder.record`); a folder without a stamp gets one. A command that cannot name its suite
(published inputs compared without ``--suite``) writes only into a folder without a stamp, and records
nothing. See docs/reports.md, "The report folder".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.errors import FidelityError, UsageError
from harness.reports.report_dir import STAMP, Stamp, check_ledger, finish_interrupted_writes, write_stamp


def check_for_writing(report_dir: Path, suite_sha256: str | None, *, option: str,
                      entries: Iterable[str] = ()) -> Stamp | None:
    """The folder's stamp (None when there is none), once the folder may take files of the suite whose
    ``suite_token_sha256`` is ``suite_sha256`` (None: a suite the writer cannot name, refused by any stamp);
    else a :class:`~harness.errors.UsageError` that names the stamp (or the entry), the expected and the found
    value, and ``option`` (how to pick another folder).
    ``entries``: sub-folders the writer will write into (none may be a symbolic link)."""
    stamp = report_dir / STAMP
    try:
        doc = check_ledger(report_dir)
    except FidelityError as e:
        raise UsageError(f"{e}; remove {stamp} (or the folder) or pass {option} DIR") from None
    refuse_linked_entries(report_dir, entries)
    if doc is None:
        return None
    found = doc.get("suite_token_sha256")  # a str by the type; a tampered stamp may hold anything
    if suite_sha256 is None:
        raise UsageError(f"{stamp}: the report folder holds reports of suite_token_sha256 {found}: expected a folder "
                         "without a stamp or the suite to check it against (--suite), found neither; pass --suite "
                         f"SUITE or {option} DIR")
    if found != suite_sha256:
        raise UsageError(f"{stamp}: the report folder holds reports of another suite: expected suite_token_sha256 "
                         f"{suite_sha256}, found {found}; pass {option} DIR (one folder per suite) or remove the folder")
    return doc


def refuse_linked_entries(report_dir: Path, entries: Iterable[str]) -> None:
    """A :class:`~harness.errors.UsageError` naming the first of ``entries`` (sub-folders of the folder a
    writer will write into) that is a symbolic link: reports are never written through one."""
    for sub in entries:
        if (report_dir / sub).is_symlink():
            raise UsageError(f"{report_dir / sub}: report folder entry: expected a folder of the report folder, "
                             "found a symbolic link (reports are never written through one)")


@dataclass(frozen=True)
class ReportFolder:
    """A report folder checked for writing by one command (:func:`open_report_folder`)."""

    #: The folder.
    path: Path
    #: ``suite_token_sha256`` of the suite the command measures: the folder's stamp says it (None: unknown,
    #: the folder had no stamp and gets none).
    suite_sha256: str | None
    #: The command line, recorded in the ledger's ``runs``.
    command: str
    #: The configuration the command read (None: the stamp keeps the one it names).
    config: Path | None = None

    def check_entries(self, entries: Iterable[str]) -> None:
        """Sub-folders known only once the inputs are read, checked as :func:`check_for_writing` checks them."""
        refuse_linked_entries(self.path, entries)

    def record(self, written: Iterable[Path]) -> list[Path]:
        """Add ``written`` (files inside the folder, already written) to the ledger and stamp the folder;
        the ledger's other entries stay while their files are unchanged. Returns ``written``."""
        files = list(written)
        if self.suite_sha256 is not None:
            write_stamp(self.path, self.suite_sha256, self.config, files, self.command, keep_summaries=True)
        return files


def open_report_folder(path: Path, suite_sha256: str | None, command: str, *, config: Path | None = None,
                       option: str = "--out", entries: Iterable[str] = ()) -> ReportFolder:
    """Check ``path`` for writing files of the suite ``suite_sha256`` (:func:`check_for_writing`) and
    complete or remove what a killed writer left half-written there; nothing is written on refusal."""
    check_for_writing(path, suite_sha256, option=option, entries=entries)
    finish_interrupted_writes(path)
    return ReportFolder(path=path, suite_sha256=suite_sha256, command=command, config=config)
