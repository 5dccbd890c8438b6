"""One helper for every string from a configuration or a model that reaches Markdown, HTML or YAML.

Names (candidates, the reference, tags, Hub ids, licenses) are written into model cards, ``report.md``,
step summaries and ladder files. Either a string is validated (:func:`check_text`: one line, printable,
no YAML document marker, bounded) or it is escaped for where it goes: :func:`md` (inline Markdown and a
table cell: no link, emphasis, code span, HTML tag or line break can form), :func:`html` (an HTML text
node or attribute) and :func:`yaml_scalar` (a double-quoted YAML scalar: no key, list or document can
form). docs/refuses.md ("Names") lists what is refused.
"""

from __future__ import annotations

import html as _html
import json
import re
import unicodedata

from harness.errors import FidelityError

#: The longest free-text value (a license, a Hub id) a configuration may put into a report.
MAX_TEXT = 200
#: Characters that open a Markdown construct anywhere in a line (code, emphasis, link or image, table
#: column, strikethrough, HTML tag or entity); escaped wherever they occur.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~<>&])")
#: What opens a block only at the start of a line (a list item, a heading, a setext underline, an ordered
#: list's ``1.``): escaped there only, so ``Qwen3-8B`` stays as written.
_LINE_START = re.compile(r"^(\d*)([-+#=.)])")
#: A Hub repository id: ``org/name`` of letters, digits, ``-``, ``_``, ``.`` (no ``..``, no leading ``-`` or ``.``).
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def text_problem(s: str, max_len: int = MAX_TEXT) -> str | None:
    """Why ``s`` cannot be written into a report as one line of text, or None."""
    if not s:
        return "empty"
    if len(s) > max_len:
        return f"{len(s)} characters, at most {max_len}"
    for ch in s:
        if unicodedata.category(ch)[0] in "CZ" and ch != " ":
            return f"holds the control or separator character U+{ord(ch):04X}"
    if s.strip() != s:
        return "leading or trailing blanks"
    if s.startswith(("---", "...")):
        return "starts like a YAML document marker"
    return None


def check_text(where: str, s: object, max_len: int = MAX_TEXT) -> str:
    """``s`` when it is one printable line (:func:`text_problem`), else a FidelityError naming ``where``."""
    if not isinstance(s, str):
        raise FidelityError(f"{where}: expected a string, found {s!r}")
    problem = text_problem(s, max_len)
    if problem:
        raise FidelityError(f"{where}: expected one printable line of text, found {s!r} ({problem})")
    return s


def hub_id_problem(s: str) -> str | None:
    """Why ``s`` is not a Hub repository id ``org/name``, or None."""
    if not HUB_ID_RE.match(s):
        return "not org/name of letters, digits, '-', '_', '.' starting with a letter or digit"
    if ".." in s or any(part.endswith(".") for part in s.split("/")):
        return "'..' or a trailing '.' in a part"
    return None


def md(s: object) -> str:
    """``s`` as literal inline Markdown (also a table cell): every construct character backslash-escaped,
    ``<`` ``>`` ``&`` as HTML entities, line breaks as spaces."""
    text = " ".join(str(s).split()) if any(c in str(s) for c in "\r\n\t\v\f\x85\u2028\u2029") else str(s)
    out = _LINE_START.sub(r"\1\\\2", _MD_SPECIAL.sub(r"\\\1", text))
    return out.replace("\\<", "&lt;").replace("\\>", "&gt;").replace("\\&", "&amp;")


def md_code(s: object) -> str:
    """``s`` in a Markdown code span that no backtick inside it can close (and no line break can end)."""
    text = " ".join(str(s).splitlines())
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def html(s: object) -> str:
    """``s`` as an HTML text node or quoted attribute value."""
    return _html.escape(str(s), quote=True)


def yaml_scalar(s: object) -> str:
    """``s`` as a double-quoted YAML scalar (a JSON string is one; YAML 1.1 and 1.2 read it back as ``s``)."""
    return json.dumps(str(s), ensure_ascii=True)
