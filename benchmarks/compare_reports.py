"""Compare two report folders byte for byte, except the fields that name a time, a run or a path.

    python benchmarks/compare_reports.py OLD_DIR NEW_DIR [--old-root DIR] [--new-root DIR]

For checking that a change of code left its results alone: the main job's report folder
(``pytest fidelity.toml --fidelity-report-dir DIR``), the GGUF, MoE and hybrid ladders' folders, or any
folder of JSON, Markdown, ``.kld``, PNG and other files. Every file is compared; exit 0 when the two
folders hold the same files and each pair is identical after masking, 1 when they differ (each difference
listed), 2 when a folder is missing.

What is masked, and why (everything else, every number and every line, must be equal):

* JSON: under a ``"timing"`` object, every ``*_s`` value (seconds a step took: the machine's load) and
  ``scores`` (whether the scores came from the score cache: the cache's state, not the result); the
  device and GEMM path beside them are compared. Anywhere, the value of
  ``"created"``, ``"started"`` and ``"finished"`` (when a file was written), and in the folder's ledger
  ``fidelity-run.json`` the run ids (random per run: ``latest_run``, the keys of ``runs``, each file's
  ``run``) and each listed file's ``sha256`` (a digest of a file that is itself compared here, and which
  changes with that file's own masked fields).
* Text (Markdown and any other UTF-8 file) and JSON strings: ISO-8601 timestamps (``2026-12-02T03:17:50Z``,
  the Markdown footers' "created ..."); in a shard page's ``Timing:`` line the same ``*_s`` seconds and
  ``scores`` state as in its JSON.
* Paths: the project root each folder was written from (``--old-root``/``--new-root``; by default the
  folder of the configuration the ledger names) and the folder's own absolute path become ``<root>`` and
  ``<reports>``: two checkouts in two folders write the same reports except for where they are.

Binary files (``.png``, ``.kld``, ``.gguf``, ...) are compared byte for byte, unmasked.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: An ISO-8601 date and time, with optional fraction and zone.
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
#: In a ``Timing:`` line of a Markdown page: the seconds of a step, and where the scores came from.
TIMING_LINE = re.compile(r"^Timing: .*$", re.M)
SECONDS = re.compile(r"\b(\w+_s) [-+0-9.e]+")
SCORES_STATE = re.compile(r"\bscores \w+")
#: JSON keys whose value is when something happened.
TIME_KEYS = frozenset({"created", "started", "finished"})
#: The report folder's ledger (harness/plugin/report_dir.py): run ids and the listed files' digests.
LEDGER = "fidelity-run.json"
#: How many differences are printed per file.
MAX_PER_FILE = 10


class Masker:
    """Masks one folder's files: its root and folder paths, timestamps, timing and ledger fields."""

    def __init__(self, folder: Path, root: Path | None) -> None:
        self.subs = [(str(folder.resolve()), "<reports>")]
        if root is None:
            root = _root_from_ledger(folder)
        if root is not None:
            self.subs.append((str(root.resolve()), "<root>"))
        self.subs.sort(key=lambda s: -len(s[0]))  # the longer (more specific) path first

    def text(self, s: str) -> str:
        for old, new in self.subs:
            s = s.replace(old, new)
        s = TIMING_LINE.sub(lambda m: SCORES_STATE.sub("scores <masked>", SECONDS.sub(r"\1 <masked>", m[0])), s)
        return TIMESTAMP.sub("<time>", s)

    def json(self, value: Any, key: str | None = None, timing: bool = False) -> Any:
        if isinstance(value, dict):
            return {self.text(k): self.json(v, k, timing or k == "timing") for k, v in value.items()}
        if isinstance(value, list):
            return [self.json(v, key, timing) for v in value]
        if (timing and key is not None and (key.endswith("_s") or key == "scores")) or key in TIME_KEYS:
            return "<masked>"
        if isinstance(value, str):
            return self.text(value)
        return value

    def ledger(self, doc: Any) -> Any:
        """The ledger with its random run ids and its files' digests masked (module docstring)."""
        if not isinstance(doc, dict):
            return doc
        doc = dict(doc)
        runs = doc.get("runs")
        if isinstance(runs, dict):  # keyed by random ids: compared as a list in a masked, stable order
            doc["runs"] = sorted(runs.values(), key=lambda r: json.dumps(self.json(r), sort_keys=True))
        if "latest_run" in doc:
            doc["latest_run"] = "<run>"
        files = doc.get("files")
        if isinstance(files, dict):
            doc["files"] = {k: ({**v, "run": "<run>", "sha256": "<sha256>"} if isinstance(v, dict) else v)
                            for k, v in files.items()}
        return doc


def _root_from_ledger(folder: Path) -> Path | None:
    try:
        config = json.loads((folder / LEDGER).read_text()).get("config")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(config).parent if isinstance(config, str) and Path(config).is_absolute() else None


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def _json_diff(a: Any, b: Any, where: str = "") -> Iterator[str]:
    """The JSON paths where two masked documents differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                yield f"{where}/{k}: {'only in new' if k not in a else 'only in old'}"
            else:
                yield from _json_diff(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _json_diff(x, y, f"{where}[{i}]")
    elif a != b or type(a) is not type(b):
        yield f"{where or '/'}: {json.dumps(a)[:120]} -> {json.dumps(b)[:120]}"


def _text_diff(a: str, b: str) -> Iterator[str]:
    la, lb = a.splitlines(keepends=True), b.splitlines(keepends=True)
    for i, (x, y) in enumerate(zip(la, lb), 1):
        if x != y:
            yield f"line {i}: {x.rstrip()[:160]!r} -> {y.rstrip()[:160]!r}"
    if len(la) != len(lb):
        yield f"{len(la)} lines -> {len(lb)} lines"


def compare_file(rel: str, old: bytes, new: bytes, mo: Masker, mn: Masker) -> list[str]:
    """The differences between one file's two versions, after masking (empty when identical)."""
    if old == new:
        return []
    if rel.endswith(".json"):
        try:
            a, b = json.loads(old), json.loads(new)
        except ValueError:
            pass
        else:
            if Path(rel).name == LEDGER:
                a, b = mo.ledger(a), mn.ledger(b)
            return list(_json_diff(mo.json(a), mn.json(b)))
    try:
        ta, tb = old.decode("utf-8"), new.decode("utf-8")
    except UnicodeDecodeError:
        return [f"binary files differ ({len(old)} bytes -> {len(new)} bytes)"]
    return list(_text_diff(mo.text(ta), mn.text(tb)))


def compare(old: Path, new: Path, old_root: Path | None = None, new_root: Path | None = None) -> list[str]:
    """Every difference between two report folders, one line each (empty when they are identical)."""
    mo, mn = Masker(old, old_root), Masker(new, new_root)
    fo, fn = _files(old), _files(new)
    out = [f"{rel}: only in {old}" for rel in sorted(fo - fn)] + [f"{rel}: only in {new}" for rel in sorted(fn - fo)]
    for rel in sorted(fo & fn):
        diffs = compare_file(rel, (old / rel).read_bytes(), (new / rel).read_bytes(), mo, mn)
        out += [f"{rel}: {d}" for d in diffs[:MAX_PER_FILE]]
        if len(diffs) > MAX_PER_FILE:
            out.append(f"{rel}: ... {len(diffs) - MAX_PER_FILE} more")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--old-root", type=Path, help="the project root OLD was written from (default: from its ledger)")
    ap.add_argument("--new-root", type=Path, help="the project root NEW was written from (default: from its ledger)")
    args = ap.parse_args(argv)
    for d in (args.old, args.new):
        if not d.is_dir():
            print(f"compare_reports: {d}: expected a report folder, found {'a file' if d.exists() else 'nothing'}",
                  file=sys.stderr)
            return 2
    diffs = compare(args.old, args.new, args.old_root, args.new_root)
    n = len(_files(args.old) | _files(args.new))
    if diffs:
        print("\n".join(diffs))
        print(f"DIFFERENT: {len(diffs)} difference(s) in {n} files ({args.old} vs {args.new})")
        return 1
    print(f"identical: {n} files ({args.old} vs {args.new}), timing, creation and path fields masked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
