"""The report folder's stamp and ledger: ``<report-dir>/fidelity-run.json``.

A run's controller stamps the folder with its suite (a run of another suite into it is refused) and
keeps a ledger of the files the harness wrote there: for each, its path relative to the folder, its
sha256 and the run that wrote it (``runs`` names each run: when it finished and its command line).

Two kinds of files, two rules:

* **Shard reports** (``<candidate>/shard-NN.json`` and ``.md``) accumulate: shards of several runs (one
  machine's share each, ``--fidelity-shards``; or one candidate at a time) are aggregated together later.
  The ledger keeps naming the run that wrote each, so a reader can tell this run's from earlier ones'.
* **Run summaries** (``ladder.*``, ``tails.*``, ``window.*``, ``paired/*``, ``adaptive.*``,
  ``cross_engine.*``) describe one run. A run that writes anything removes the previous runs' summaries
  first, so every summary in the folder is the latest run's. Only files the ledger lists with an unchanged
  sha256 are removed: never a user's file, never one edited since the harness wrote it (such a file is
  kept, dropped from the ledger and named on the terminal).

Files the ledger does not list (a user's, or written by an older harness) are never touched. Only the
controller writes here (never a pytest-xdist worker).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: The stamp a run leaves in its report folder: which suite the reports there measure, and the ledger.
STAMP = "fidelity-run.json"
SCHEMA = "fidelity.report-dir/2"
#: A shard report's path relative to the folder; every other ledger entry is a run summary.
_SHARD = re.compile(r"^[^/]+/shard-\d+\.(json|md)$")


def is_shard_report(rel: str) -> bool:
    return bool(_SHARD.match(rel))


def read_stamp(report_dir: Path) -> dict[str, Any] | None:
    """The folder's stamp, or None when there is none or it cannot be read as a JSON object."""
    try:
        doc = json.loads((report_dir / STAMP).read_text("utf-8"))
    except (ValueError, OSError):
        return None
    return doc if isinstance(doc, dict) else None


def _sha256(path: Path) -> str | None:
    from harness.io.hashing import sha256_file

    try:
        return sha256_file(path) if path.is_file() else None
    except OSError:
        return None


def _ledger(stamp: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    files = (stamp or {}).get("files")
    return {str(k): v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}


def remove_previous_summaries(report_dir: Path) -> list[str]:
    """Remove the run summaries the ledger lists whose content is unchanged; returns the paths (relative)
    of listed summaries that were edited since and are kept. Empty folders left behind are removed."""
    changed = []
    for rel, entry in _ledger(read_stamp(report_dir)).items():
        if is_shard_report(rel):
            continue
        path = report_dir / rel
        found = _sha256(path)
        if found is None:
            continue
        if found != entry.get("sha256"):
            changed.append(rel)
            continue
        path.unlink()
        parent = path.parent
        if parent != report_dir and not any(parent.iterdir()):
            parent.rmdir()
    return sorted(changed)


def write_stamp(report_dir: Path, suite_sha256: str, config: Path, written: Iterable[Path], command: str) -> dict[str, Any]:
    """Stamp the folder and record this run's files (``written``, paths inside the folder) in the ledger.

    Entries of earlier runs stay while their file is present with the recorded sha256 (shard reports this run
    did not rewrite); the rest are dropped. ``command``: this run's command line. Returns the stamp written."""
    from harness.io.atomic import atomic_write_text

    report_dir.mkdir(parents=True, exist_ok=True)
    old = read_stamp(report_dir)
    run_id = uuid.uuid4().hex[:12]
    finished = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    files: dict[str, dict[str, Any]] = {}
    for rel, entry in _ledger(old).items():
        if is_shard_report(rel) and _sha256(report_dir / rel) == entry.get("sha256"):
            files[rel] = entry
    for path in written:
        rel = Path(os.path.relpath(path, report_dir)).as_posix()
        sha = _sha256(path)
        if sha is not None:
            files[rel] = {"sha256": sha, "run": run_id}
    old_runs = (old or {}).get("runs")
    runs = {k: v for k, v in old_runs.items() if any(e.get("run") == k for e in files.values())} \
        if isinstance(old_runs, dict) else {}
    runs[run_id] = {"finished": finished, "command": command}
    doc = {"schema": SCHEMA, "suite_token_sha256": suite_sha256, "config": str(config), "latest_run": run_id,
           "runs": runs, "files": dict(sorted(files.items()))}
    atomic_write_text(report_dir / STAMP, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def earlier_shard_reports(stamp: dict[str, Any]) -> list[str]:
    """Shard reports (``.json``) in the ledger written by a run other than the latest one."""
    latest = stamp.get("latest_run")
    return [rel for rel, e in _ledger(stamp).items()
            if rel.endswith(".json") and is_shard_report(rel) and e.get("run") != latest]
