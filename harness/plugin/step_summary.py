"""The run on a GitHub Actions job page: the ladder and the failing cases appended to ``$GITHUB_STEP_SUMMARY``.

GitHub Actions sets ``GITHUB_STEP_SUMMARY`` to a file whose Markdown it shows on the job's summary page.
When it is set, the controller appends, at the end of the run: the configuration in use, the ladder table
(the same rows as ``ladder.md``), the candidates that have no row, and every failing fidelity case with its
message (which ends with the command that updates its baseline, when it failed against one). Nothing is
written without the variable, and pytest-xdist workers never write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

ENV = "GITHUB_STEP_SUMMARY"
#: The markers of the plugin's cases (harness.plugin.pytest_plugin.MARKERS): a failed case carrying one is listed.
CASE_MARKERS = ("fidelity", "fidelity_tails", "fidelity_window", "fidelity_paired", "fidelity_cross_engine")
#: Lines of one failing case's message shown on the page (the rest is in the job log).
MAX_LINES = 30


def failing_case(report: pytest.TestReport, markers: Sequence[str]) -> tuple[str, str] | None:
    """``(node id, message)`` of a failed fidelity case (one carrying a plugin marker), else None."""
    if not report.failed or not any(m in report.keywords for m in markers):
        return None
    return report.nodeid, str(report.longreprtext)


def render(config_path: str, ladder: Sequence[str], missing: Sequence[Mapping[str, str]], failures: Sequence[tuple[str, str]],
           notes: Sequence[str] = ()) -> str:
    """The Markdown appended to the summary page; ``missing``: the candidates without a report (``candidate``,
    ``status``, ``reason``)."""
    lines = [f"## fidelity: `{config_path}`", ""]
    if ladder:
        lines += ["### Ladder", "", *ladder, ""]
    lines += [f"- not in the ladder: `{m['candidate']}`: {m['status']}: {m['reason']}" for m in missing]
    if missing:
        lines.append("")
    if failures:
        lines += [f"### Failing cases ({len(failures)})", ""]
        for nodeid, text in failures:
            body = text.strip().splitlines()
            shown = body[:MAX_LINES] + ([f"... ({len(body) - MAX_LINES} more lines in the job log)"] if len(body) > MAX_LINES else [])
            lines += [f"- `{nodeid}`", "", "  ```", *(f"  {line}" for line in shown), "  ```", ""]
    else:
        lines += ["No failing fidelity case.", ""]
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines).rstrip("\n") + "\n\n"


def append(path: str | Path, text: str) -> None:
    """Append ``text`` to the summary file (GitHub concatenates what every step appends)."""
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(text)
