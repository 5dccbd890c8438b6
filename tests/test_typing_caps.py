"""The typed report layer: how many ``Any`` annotations ``harness/reports/`` and ``harness/plugin/`` may hold.

Counted on the source's syntax tree (every name ``Any`` or ``typing.Any``, in annotations, aliases and
casts alike; the import itself is not a name), the two folders together. The cap only goes down: when a
change removes some, lower it to the new count. Each remaining one carries ``# Any: <reason>`` on its line
(a JSON document before its schema check, an untyped third-party object, a registry of kinds whose payload
records differ)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"

#: The count today, reports/ and plugin/ together (before the typed report layer: reports 222 + plugin 64 = 286).
#: The cap only goes down: when a change removes some, lower it to the new count.
CAP = 7
FOLDERS = ("reports", "plugin")
#: The comment every line naming ``Any`` carries: ``# Any: <why no precise type fits>``.
REASON = re.compile(r"#\s*Any:\s*\S")


def any_lines(source: str) -> list[int]:
    """The line numbers (1-based) of the ``Any`` names of one module's source, as :func:`any_names` counts them."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Name) and node.id == "Any") or (
                isinstance(node, ast.Attribute) and node.attr == "Any" and isinstance(node.value, ast.Name)
                and node.value.id in ("typing", "t")):
            lines.append(node.lineno)
    return lines


def any_names(source: str) -> int:
    """The ``Any`` names of one module's source: ``Any`` and ``typing.Any`` / ``t.Any``."""
    return len(any_lines(source))


def unexplained(source: str) -> list[int]:
    """Lines naming ``Any`` without a ``# Any: <reason>`` comment on the same line."""
    text = source.splitlines()
    return sorted({n for n in any_lines(source) if not REASON.search(text[n - 1])})


def test_any_names_counts_annotations_not_imports_or_text() -> None:
    src = ('from typing import Any\nimport typing\n"""Any in a docstring."""\n'
           "def f(x: Any, y: typing.Any) -> dict[str, Any]:  # Any in a comment\n    return cast(Any, x)\n")
    assert any_names(src) == 4


def test_a_line_naming_any_needs_its_reason() -> None:
    src = ("from typing import Any\n"
           "def f(x: Any) -> None:  # Any: pytest's untyped hook argument\n    pass\n"
           "def g(x: Any) -> None:  # a comment that gives no reason\n    pass\n"
           "y: dict[str, Any] = {}\n")
    assert unexplained(src) == [4, 6]


def _modules() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((HARNESS / folder).rglob("*.py"))]


def test_any_in_the_report_layer_is_capped() -> None:
    count = sum(any_names(p.read_text()) for p in _modules())
    assert count <= CAP, f"{count} Any in {' + '.join(FOLDERS)} > cap {CAP} (type the new code, or give each its reason)"


def test_every_any_in_the_report_layer_says_why() -> None:
    missing = [f"{p.relative_to(HARNESS.parent)}:{n}" for p in _modules() for n in unexplained(p.read_text())]
    assert not missing, f"Any without a '# Any: <reason>' comment on its line: {missing}"
