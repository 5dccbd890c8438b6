"""Module docstrings are headers: what the module is, in at most 12 lines, with the reasoning in docs/.

Every pointer a module docstring makes into docs/ (``docs/<page>.md §"<section>"``) names a page that
exists and a heading of it, so a reader following it lands where the reasoning is.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 12
#: Modules allowed over the limit, with the reason (none; an entry under the limit fails too).
LONG_ALLOWED: dict[str, str] = {}
POINTER = re.compile(r'docs/([\w-]+\.md) §"([^"]+)"')


def _docstrings() -> dict[str, str]:
    out = {}
    for path in sorted((ROOT / "harness").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text("utf-8"), str(path)))
        if doc:
            out[path.relative_to(ROOT / "harness").as_posix()] = doc
    return out


def long_headers(docs: dict[str, str]) -> dict[str, int]:
    return {rel: n for rel, doc in docs.items() if (n := len(doc.splitlines())) > MAX_LINES}


def test_module_headers_are_short() -> None:
    long = long_headers(_docstrings())
    over = {rel: n for rel, n in long.items() if rel not in LONG_ALLOWED}
    assert not over, f"module docstrings over {MAX_LINES} lines (move the reasoning into docs/): {over}"
    stale = sorted(set(LONG_ALLOWED) - set(long))
    assert not stale, f"allowed to be long but no longer are: drop them from LONG_ALLOWED: {stale}"


def test_the_length_rule_sees_a_long_header() -> None:
    assert long_headers({"a.py": "what\n" * 12, "b.py": "what\n" * 13}) == {"b.py": 13}


def _headings(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text("utf-8"), flags=re.S)
    return [m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", text, re.M)]


def test_pointers_into_docs_name_a_page_and_a_section() -> None:
    missing = []
    for rel, doc in _docstrings().items():
        for page, section in POINTER.findall(doc):
            path = ROOT / "docs" / page
            if not path.exists():
                missing.append(f"{rel}: docs/{page} does not exist")
            elif not any(h.startswith(section) for h in _headings(path)):
                missing.append(f'{rel}: docs/{page} has no heading "{section}"')
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize(("doc", "ok"), [('Reasoning: docs/statistics.md §"Tail intervals".', True),
                                         ('Reasoning: docs/statistics.md §"No such section".', False)])
def test_the_pointer_rule_reads_the_page(doc: str, ok: bool) -> None:
    (page, section), = POINTER.findall(doc)
    assert any(h.startswith(section) for h in _headings(ROOT / "docs" / page)) is ok
