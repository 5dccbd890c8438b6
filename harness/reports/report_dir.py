"""The report folder's stamp and ledger: ``<report-dir>/fidelity-run.json``.

A run's controller stamps the folder with its suite (a run of another suite into it is refused) and
keeps a ledger of the files the harness wrote there: for each, its path relative to the folder, its
sha256 and the run that wrote it (``runs`` names each run: when it finished and its command line),
and the sub-folders a run created (``folders``).

Reasoning: docs/reports.md §"The report folder's ledger".
"""

from __future__ import annotations

import datetime
import json
import os
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import NotRequired, TypedDict

from harness.errors import VerificationError
from harness.io.atomic import atomic_write_text, finish_pending
from harness.io.hashing import sha256_file
from harness.io.jsonio import read_json, type_name
from harness.io.owned import check_relative, owned_file, remove_empty_folder, symlink_on_path
from harness.io.schema import checked

#: The stamp a run leaves in its report folder: which suite the reports there measure, and the ledger.
STAMP = "fidelity-run.json"
SCHEMA = "fidelity.report-dir/3"
#: Stamps this harness reads (the /2 stamp had no ``folders``).
_READABLE = (SCHEMA, "fidelity.report-dir/2")
#: A candidate's name as the configuration allows it (harness.inputs.config).
_NAME = r"[A-Za-z0-9][A-Za-z0-9_.+]*"
#: The name of a candidate a shard report measures: the configuration's names, and the built candidates of
#: ``fidelity allocate --check`` (``alloc-<budget>``, ``uniform-<choice>``), which also take ``-``.
_REPORT_NAME = r"[A-Za-z0-9][A-Za-z0-9_.+-]*"
#: A shard report's path relative to the folder.
_SHARD = re.compile(rf"^{_REPORT_NAME}/shard-\d{{2,}}\.(json|md)$")
#: The run summaries this project's writers produce, relative to the folder.
_SUMMARY = re.compile(rf"^((ladder|window|adaptive|cross_engine|precision_floor)\.(json|md)|tails\.(json|md|png)"
                      rf"|paired/{_NAME}-vs-{_NAME}\.(json|md))$")
#: What a ``fidelity`` command writes into a report folder (harness.reports.report_folder), relative to the folder.
_OUTPUT = re.compile(rf"^((layers|attribution)\.(json|md|png)|allocation\.(json|md)|kld-vs-size\.png"
                     rf"|alloc-[A-Za-z0-9_.+-]+/(layout\.json|recipe\.yaml|tensor-types\.txt)"
                     rf"|{_NAME}/aggregate\.json|published-aggregate\.json|receipts\.(json|md)|paired-receipt\.(json|md)"
                     rf"|paired/{_NAME}-vs-{_NAME}\.published\.json)$")
#: Sub-folders a run may create for its summaries (removed when emptied, if the ledger says a run created them).
SUMMARY_FOLDERS = ("paired",)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: A file staged by harness.io.atomic and never renamed: ``.<name>.<random>.tmp``.
_STAGED = re.compile(r"^\.(.+)\.[A-Za-z0-9_]{8}\.tmp$")


class LedgerEntry(TypedDict):
    """A file of the folder as the ledger lists it: its sha256 when written, and the run that wrote it."""

    sha256: str
    run: str


class Stamp(TypedDict):
    """``fidelity-run.json`` (docs/reports.md §"The report folder's ledger"): the suite the folder's reports measure and the ledger."""

    schema: str
    files: dict[str, LedgerEntry]
    #: run id -> ``{finished, command}``
    runs: dict[str, dict[str, object]]
    #: the summary folders a run created (absent from ``fidelity.report-dir/2`` stamps)
    folders: NotRequired[list[str]]
    suite_token_sha256: NotRequired[str]
    config: NotRequired[str]
    latest_run: NotRequired[str]


def is_shard_report(rel: str) -> bool:
    return bool(_SHARD.match(rel))


def accumulates(rel: str) -> bool:
    """A shard report or a command's output: kept across runs while unchanged (module docstring)."""
    return bool(_SHARD.match(rel) or _OUTPUT.match(rel))


def ledger_name(rel: str) -> bool:
    """A name the ledger may list: a shard report, a run summary or a command's output."""
    return bool(_SHARD.match(rel) or _SUMMARY.match(rel) or _OUTPUT.match(rel))


def check_ledger(report_dir: Path) -> Stamp | None:
    """The folder's stamp, checked (docs/reports.md §"The report folder's ledger"); None when there is none. A stamp that is a
    symbolic link, not strict JSON, of another schema, or whose ledger names anything this project does
    not write is a :class:`~harness.errors.VerificationError` naming the stamp, the entry, the expected
    and the found value."""
    path = report_dir / STAMP
    if path.is_symlink():
        raise VerificationError(path, "report folder stamp", "a regular file", "a symbolic link")
    if not path.exists():
        return None
    doc = read_json(path)
    if doc.get("schema") not in _READABLE:
        raise VerificationError(path, "schema", " or ".join(_READABLE), repr(doc.get("schema")))
    files, folders, runs = doc.get("files"), doc.get("folders", []), doc.get("runs")
    if not isinstance(files, dict):
        raise VerificationError(path, "files", "an object {path: {sha256, run}}", type_name(files))
    if not isinstance(runs, dict) or not all(isinstance(v, dict) for v in runs.values()):
        raise VerificationError(path, "runs", "an object {run id: {finished, command}}", type_name(runs))
    for rel, entry in files.items():
        check_relative(rel, path, f"files[{rel!r}]")
        if not ledger_name(rel):
            raise VerificationError(path, f"files[{rel!r}]", "a shard report (<candidate>/shard-NN.json|md), a run "
                                    "summary (ladder, tails, window, adaptive, cross_engine, paired/<a>-vs-<b>) or a "
                                    "command's output (layers, attribution, allocation, <candidate>/aggregate.json, ...)",
                                    "another name (a tampered ledger: nothing was deleted)")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                or not _SHA256.match(entry["sha256"]) or not isinstance(entry.get("run"), str):
            raise VerificationError(path, f"files[{rel!r}]", "{sha256: 64 hex digits, run: string}", entry)
        link = symlink_on_path(report_dir, rel)
        if link is not None:
            raise VerificationError(path, f"files[{rel!r}]", "a file reached without a symbolic link",
                                    f"{link} is a symbolic link (a tampered folder: nothing was deleted)")
    if not isinstance(folders, list) or not all(f in SUMMARY_FOLDERS for f in folders):
        raise VerificationError(path, "folders", f"a list of {', '.join(SUMMARY_FOLDERS)}", folders)
    return checked(doc, Stamp, path)


def finish_interrupted_writes(report_dir: Path) -> list[Path]:
    """Before a run writes here: complete the multi-file writes a killed run left half-renamed
    (:func:`harness.io.atomic.finish_pending`), then remove the files it staged and never renamed
    (``.<name>.<random>.tmp`` of a name this project writes here, regular files reached without a link).
    Returns the staged files removed."""
    removed: list[Path] = []
    if not report_dir.is_dir() or report_dir.is_symlink():
        return removed
    folders = [report_dir] + sorted(p for p in report_dir.iterdir() if p.is_dir() and not p.is_symlink())
    for folder in folders:
        finish_pending(folder)
        for p in sorted(folder.iterdir()):
            m = _STAGED.match(p.name)
            if m is None or not p.is_file() or p.is_symlink():
                continue
            rel = Path(os.path.relpath(folder / m.group(1), report_dir)).as_posix()
            if rel == STAMP or ledger_name(rel):
                p.unlink()
                removed.append(p)
    return removed


def _sha256(path: Path) -> str | None:
    try:
        return sha256_file(path) if path.is_file() and not path.is_symlink() else None
    except OSError:
        return None


def _ledger(stamp: Stamp | None) -> dict[str, LedgerEntry]:
    return {} if stamp is None else dict(stamp["files"])


def remove_previous_summaries(report_dir: Path) -> list[str]:
    """Remove the run summaries the ledger lists whose content is unchanged; returns the paths (relative)
    of listed summaries that were edited since and are kept. A folder a run created (the ledger's
    ``folders``) is removed when left empty. The whole ledger is checked first (:func:`check_ledger`): a
    tampered one raises and nothing is deleted."""
    stamp = check_ledger(report_dir)
    changed, doomed = [], []
    for rel, entry in _ledger(stamp).items():
        if accumulates(rel):
            continue
        if (report_dir / rel).exists() and not (report_dir / rel).is_file():
            changed.append(rel)  # a folder (or another entry) in its place now: not the harness's file, kept
            continue
        path = owned_file(report_dir, rel, report_dir / STAMP, f"files[{rel!r}]")
        if path is None:
            continue
        if _sha256(path) != entry["sha256"]:
            changed.append(rel)
            continue
        doomed.append(path)
    for path in doomed:
        path.unlink()
    for folder in [] if stamp is None else stamp.get("folders", []):
        remove_empty_folder(report_dir / folder)
    return sorted(changed)


def summary_folders_present(report_dir: Path) -> set[str]:
    """The summary sub-folders that exist now (a run compares before and after to know what it created)."""
    return {f for f in SUMMARY_FOLDERS if (report_dir / f).is_dir() and not (report_dir / f).is_symlink()}


def write_stamp(report_dir: Path, suite_sha256: str, config: Path | None, written: Iterable[Path], command: str,
                created: Iterable[str] = (), *, keep_summaries: bool = False) -> Stamp:
    """Stamp the folder and record this run's files (``written``, paths inside the folder) in the ledger.

    Entries of earlier runs stay while their file is present with the recorded sha256: shard reports and
    commands' outputs this run did not rewrite, and with ``keep_summaries`` (a command that adds to the
    folder and removed nothing) the run summaries too; the rest are dropped. ``config``: the configuration
    the run read (None: the stamp's earlier one stays). ``command``: this run's command line. ``created``:
    the summary folders this run created (:data:`SUMMARY_FOLDERS`); an earlier run's stay listed while they
    exist. Returns the stamp written."""
    report_dir.mkdir(parents=True, exist_ok=True)
    try:
        old = check_ledger(report_dir)
    except VerificationError:
        old = None  # never carried over: only this run's own files are listed
    run_id = uuid.uuid4().hex[:12]
    finished = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    files: dict[str, LedgerEntry] = {}
    for rel, entry in _ledger(old).items():
        if (keep_summaries or accumulates(rel)) and _sha256(report_dir / rel) == entry["sha256"]:
            files[rel] = entry
    for path in written:
        rel = Path(os.path.relpath(path, report_dir)).as_posix()
        sha = _sha256(path)
        if sha is not None and ledger_name(rel):
            files[rel] = {"sha256": sha, "run": run_id}
    old_runs = {} if old is None else old["runs"]
    runs = {k: v for k, v in old_runs.items() if any(e["run"] == k for e in files.values())}
    runs[run_id] = {"finished": finished, "command": command}
    present = summary_folders_present(report_dir)
    folders = sorted(present & (set(created) | set([] if old is None else old.get("folders", []))))
    kept_config = "" if old is None else old.get("config", "")
    doc: Stamp = {"schema": SCHEMA, "suite_token_sha256": suite_sha256,
                  "config": str(config) if config is not None else kept_config, "latest_run": run_id,
                  "runs": runs, "files": dict(sorted(files.items())), "folders": folders}
    atomic_write_text(report_dir / STAMP, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def earlier_shard_reports(stamp: Stamp) -> list[str]:
    """Shard reports (``.json``) in the ledger written by a run other than the latest one."""
    latest = stamp.get("latest_run")
    return [rel for rel, e in _ledger(stamp).items()
            if rel.endswith(".json") and is_shard_report(rel) and e["run"] != latest]
