"""The one escaping/validation helper for strings that reach Markdown, HTML or YAML (harness/io/escape.py):
hostile names rendered by a real CommonMark parser (markdown-it-py) and a real YAML parser form no link,
tag, emphasis, table column, key or document; the text comes back as given."""

from __future__ import annotations

import html as stdlib_html

import pytest

from harness.errors import FidelityError
from harness.io.escape import check_text, html, hub_id_problem, md, md_code, text_problem, yaml_scalar

HOSTILE = [
    "ref\n---\nlicense: mit", "<script>alert(1)</script>", "[click](javascript:alert(1))", "a|b|c",
    "*bold* _em_ `code`", "# heading", "![img](x.png)", "&lt;already&gt;", "\\*", "- item", "1. item",
    "<https://evil.example>", "a\u2028b", "~~strike~~", "{{template}}", "x: [1, 2]",
]


@pytest.mark.parametrize("s", HOSTILE)
def test_md_renders_to_the_literal_text_in_one_paragraph(s: str) -> None:
    markdown_it = pytest.importorskip("markdown_it")
    out = markdown_it.MarkdownIt("commonmark").enable("table").enable("strikethrough").render(md(s))
    want = " ".join(s.split())
    assert out == f"<p>{stdlib_html.escape(want, quote=False)}</p>\n".replace("&#x27;", "'")


@pytest.mark.parametrize("s", HOSTILE)
def test_md_in_a_table_cell_stays_one_cell(s: str) -> None:
    markdown_it = pytest.importorskip("markdown_it")
    table = f"| a | b |\n|---|---|\n| {md(s)} | end |\n"
    out = markdown_it.MarkdownIt("commonmark").enable("table").render(table)
    assert out.count("<td>") == 2 and "<a " not in out and "<script" not in out and "<em>" not in out


@pytest.mark.parametrize("s", HOSTILE)
def test_yaml_scalar_reads_back_as_the_string(s: str) -> None:
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(f"key: {yaml_scalar(s)}\nother: 1\n") == {"key": s, "other": 1}


def test_html_and_code_span() -> None:
    markdown_it = pytest.importorskip("markdown_it")
    assert html('<a href="x">') == "&lt;a href=&quot;x&quot;&gt;"
    out = markdown_it.MarkdownIt("commonmark").render(md_code("a``b`"))
    assert out == "<p><code>a``b`</code></p>\n"


@pytest.mark.parametrize(("s", "problem"), [
    ("", "empty"), ("a\nb", "U+000A"), ("\u200bx", "U+200B"), (" x", "blanks"), ("---", "YAML"), ("x" * 201, "at most 200"),
])
def test_text_refused_naming_the_problem(s: str, problem: str) -> None:
    assert problem in (text_problem(s) or "")
    with pytest.raises(FidelityError, match=r"card\.license: expected one printable line"):
        check_text("card.license", s)


def test_hub_ids() -> None:
    assert hub_id_problem("Qwen/Qwen3-8B") is None
    for bad in ("org/..", "../x", "org/a/b", "org", "org/.hidden", "org/x.", "-o/x"):
        assert hub_id_problem(bad), bad
