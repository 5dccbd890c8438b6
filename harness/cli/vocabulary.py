"""The ``fidelity`` command's one vocabulary: ``--config``, ``--reports``, ``--out``, ``--license``, ``--quiet``,
``--no-score-cache``.

Each shared option is added by one helper here, so it is spelled and explained the same on every command
(docs/commands.md, "One vocabulary"). A positional form is kept where it is natural (``fidelity ladder
fidelity.toml``, ``fidelity aggregate a/ b/``) beside the option; :func:`resolve` merges the two after parsing.
An old spelling keeps working for one release through :class:`Deprecated`, which prints one note on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.reports.report_folder import ReportFolder, open_report_folder

#: The suffix of a positional form's dest; :func:`resolve` moves its value onto the option's dest.
POSITIONAL = "_positional"
#: The namespace key listing the dests a command requires in one of their two forms.
_REQUIRED = "_vocabulary_required"


class Deprecated(argparse.Action):
    """An old spelling of an option: stores like the new one and prints one deprecation note on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"fidelity: note: {option_string} is deprecated and will be removed in the next release: use {self.new}",
              file=sys.stderr)
        if self.nargs in ("+", "*") and isinstance(getattr(namespace, self.dest, None), list):
            values = [*getattr(namespace, self.dest), *values]
        setattr(namespace, self.dest, values)


def deprecated(p: argparse.ArgumentParser, old: str, new: str, *, dest: str, **kwargs: Any) -> None:
    """Accept ``old`` as a hidden alias of ``new`` (same dest, same value type) with a deprecation note."""
    p.add_argument(old, dest=dest, action=Deprecated, new=new, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def _require(p: argparse.ArgumentParser, dest: str) -> None:
    p.set_defaults(**{_REQUIRED: [*(p.get_default(_REQUIRED) or []), dest]})


def add_out(p: argparse.ArgumentParser, help: str, *, required: bool = True, default: Path | None = None,
            old: Sequence[str] = ()) -> None:
    """``--out PATH``: where the command writes (a file or a folder, as ``help`` says)."""
    p.add_argument("--out", type=Path, required=required, default=default, help=help)
    for spelling in old:
        deprecated(p, spelling, "--out", dest="out", type=Path)


def open_out(a: argparse.Namespace, suite_sha256: str | None, *, config: Path | None = None,
             entries: Sequence[str] = ()) -> ReportFolder:
    """``--out`` opened as a report folder for files of the suite ``suite_sha256``: its stamp honoured, what the
    command writes recorded in its ledger (:mod:`harness.reports.report_folder`)."""
    command = getattr(a, "command_line", None) or f"fidelity {getattr(a, 'command', '')}".strip()
    return open_report_folder(a.out, suite_sha256, command, config=config, entries=entries)


def add_config(p: argparse.ArgumentParser, help: str, *, positional: bool = False, required: bool = False,
               default: Path | None = None) -> None:
    """``--config FILE``: the fidelity.toml; with ``positional``, also ``CONFIG`` as the first argument."""
    if positional:
        p.add_argument("config" + POSITIONAL, type=Path, nargs="?", default=None, metavar="CONFIG",
                       help=f"{help} (or --config)")
        if required:
            _require(p, "config")
    p.add_argument("--config", type=Path, required=required and not positional, default=default, help=help)


def add_reports(p: argparse.ArgumentParser, help: str, *, positional: bool = False, many: bool = False,
                required: bool = False) -> None:
    """``--reports PATH``: a report folder this command reads (``many``: one or more files or folders, repeatable)."""
    if positional:
        p.add_argument("reports" + POSITIONAL, type=Path, nargs="*", default=[], metavar="REPORTS",
                       help=f"{help} (or --reports)")
        if required:
            _require(p, "reports")
    if many:
        p.add_argument("--reports", type=Path, nargs="+", action="extend", default=[], help=help)
    else:
        p.add_argument("--reports", type=Path, required=required and not positional, default=None, help=help)


def add_license(p: argparse.ArgumentParser, help: str, *, old: Sequence[str] = ()) -> None:
    """``--license ID``: an SPDX license identifier, the word the dataset card and the Hub use."""
    p.add_argument("--license", default=None, help=help)
    for spelling in old:
        deprecated(p, spelling, "--license", dest="license")


def add_quiet(p: argparse.ArgumentParser) -> None:
    """``--quiet``: no progress while the command runs; its result lines and errors still print."""
    p.add_argument("--quiet", action="store_true",
                   help="no progress while it runs (progress bars, per-case lines); results and errors still print")


def resolve(args: argparse.Namespace) -> str | None:
    """Move each positional form onto its option's dest; the usage error to print, or None when the forms agree."""
    for key in [k for k in vars(args) if k.endswith(POSITIONAL)]:
        dest = key[: -len(POSITIONAL)]
        given, option = getattr(args, key), getattr(args, dest, None)
        delattr(args, key)
        if given in (None, []):
            continue
        if option not in (None, []):
            flag = "--" + dest
            return f"{dest} given twice: as {' '.join(map(str, given if isinstance(given, list) else [given]))} and as {flag}: give one"
        setattr(args, dest, given)
    for dest in getattr(args, _REQUIRED, None) or []:
        if getattr(args, dest, None) in (None, []):
            return f"the following arguments are required: {dest.upper()} (or --{dest})"
    if hasattr(args, _REQUIRED):
        delattr(args, _REQUIRED)
    return None


def add_no_score_cache(p: argparse.ArgumentParser) -> None:
    """``--no-score-cache``: score and summarize every case, reading and keeping nothing in ``<cache_dir>/scores/``
    and ``summaries/`` (pytest's ``--fidelity-no-score-cache``; ``[settings] score_cache = false``)."""
    p.add_argument("--no-score-cache", dest="no_score_cache", action="store_true",
                   help="score and summarize every candidate x shard: neither read nor keep scored positions and "
                        "summaries (as [settings] score_cache = false; captures are still cached)")
