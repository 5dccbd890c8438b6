"""One helper per job: the safetensors header reader (harness/io/safetensors_header.py), the file hash
(harness/io/hashing.py) and the atomic writer (harness/io/atomic.py), each checked against an independent
source, and an AST scan of harness/ that fails on a second header parser or a hash loop elsewhere."""

from __future__ import annotations

import ast
import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from harness.errors import VerificationError
from harness.io.atomic import atomic_writer
from harness.io.hashing import sha256_file
from harness.io.safetensors_header import MAX_HEADER_BYTES, parse_header, read_header

ROOT = Path(__file__).resolve().parents[1] / "harness"

#: Modules allowed to hash in a loop, with the reason (none may hash a whole file read into memory).
HASH_LOOP_ALLOWED = {
    "io/hashing.py": "the helper itself",
    "llamacpp/kld_parts.py": "a .kld published in parts: each part's digest and the whole file's, from one stream",
}


def _raw_header(path: Path) -> dict[str, dict[str, object]]:
    """The header as the format defines it (8-byte little-endian length, then JSON), parsed here on its own."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n])


def test_the_header_reader_agrees_with_the_file(tmp_path: Path) -> None:
    """Names, dtypes, shapes, byte sizes (data_offsets) and metadata, from safe_open and from bytes in memory."""
    path = tmp_path / "m.safetensors"
    save_file({"a": np.zeros((3, 5), np.float32), "b": np.ones(7, np.int8), "c": np.zeros((2, 0, 4), np.float16),
               "d": np.zeros((1, 2, 3), np.uint64)}, str(path), metadata={"fidelity": '{"index": 3}'})
    raw = _raw_header(path)
    want = {k: (v["dtype"], tuple(v["shape"]), v["data_offsets"][1] - v["data_offsets"][0])  # type: ignore[index]
            for k, v in raw.items() if k != "__metadata__"}
    for header in (read_header(path), parse_header(path.read_bytes(), path)):
        assert {k: (t.dtype, t.shape, t.nbytes) for k, t in header.tensors.items()} == want
        assert header.metadata == raw["__metadata__"]


@pytest.mark.parametrize(("data", "reason"), [
    (b"\x01\x00", "shorter than the 8-byte header length"),
    ((MAX_HEADER_BYTES + 1).to_bytes(8, "little") + b"{}", "header length 100000001"),
    ((64).to_bytes(8, "little") + b"{}", "header length 64"),  # longer than the data
    ((2).to_bytes(8, "little") + b"[]", "header is a list"),
    ((9).to_bytes(8, "little") + b'{"a": 1}\n', "tensor 'a'"),
])
def test_a_bad_header_is_one_error(data: bytes, reason: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    for read in (lambda: read_header(path), lambda: parse_header(data, path)):
        with pytest.raises(VerificationError, match=r"bad.safetensors: corrupt or truncated safetensors"):
            read()
    with pytest.raises(VerificationError, match=reason):
        parse_header(data, path)


def test_the_file_hash_is_sha256_of_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = np.random.default_rng(0).bytes(3 * (1 << 20) + 17)  # more than one block
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_the_atomic_writer_writes_whole_or_nothing(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "x.kld"
    with atomic_writer(out) as fh:
        fh.write(b"abc")
        fh.write(b"def")
        assert not out.exists()  # nothing under the final name while writing
    assert out.read_bytes() == b"abcdef"
    with pytest.raises(RuntimeError), atomic_writer(out) as fh:
        fh.write(b"half")
        raise RuntimeError("interrupted")
    assert out.read_bytes() == b"abcdef" and sorted(p.name for p in out.parent.iterdir()) == ["x.kld"]


# ----------------------------------------------------------------------------- the scan of harness/


def _is_read_bytes(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "read_bytes"


def _hashes(node: ast.Call) -> bool:
    """A call of a hashlib constructor or of the helpers' ``sha256_bytes``."""
    f = node.func
    return ((isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "hashlib")
            or (isinstance(f, ast.Name) and f.id == "sha256_bytes"))


def _offences(tree: ast.AST, rel: str) -> list[str]:
    found = []
    hashers = set()  # names bound to a hashlib object anywhere in the module
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = [t for tgt in node.targets for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value] * len(targets)
            for t, v in zip(targets, values, strict=False):
                if isinstance(t, ast.Name) and isinstance(v, ast.Call) and _hashes(v):
                    hashers.add(t.id)
    for node in ast.walk(tree):
        # a second safetensors header parser: the 8-byte length decoded by hand, or the header's metadata key
        if isinstance(node, ast.Constant) and node.value == "__metadata__":
            found.append(f"{rel}:{node.lineno}: reads a safetensors header's __metadata__ by hand")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "unpack" \
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "<Q":
            found.append(f"{rel}:{node.lineno}: decodes an 8-byte length by hand")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_bytes" \
                and node.args and isinstance(node.args[0], ast.Call) and isinstance(node.args[0].func, ast.Attribute) \
                and node.args[0].func.attr == "read":
            found.append(f"{rel}:{node.lineno}: decodes a length read from a file by hand")
        # a file hashed whole in memory, or a hash loop
        if isinstance(node, ast.Call) and _hashes(node) and any(_is_read_bytes(a) for a in node.args):
            found.append(f"{rel}:{node.lineno}: hashes a whole file read into memory (use harness.io.hashing.sha256_file)")
        if isinstance(node, (ast.For, ast.While)) and rel not in HASH_LOOP_ALLOWED:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "update" \
                        and isinstance(inner.func.value, ast.Name) and inner.func.value.id in hashers:
                    found.append(f"{rel}:{inner.lineno}: a hash loop (use harness.io.hashing.sha256_file)")
    return found


def test_one_header_parser_and_one_file_hash() -> None:
    offences = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "io/safetensors_header.py":
            continue
        offences += _offences(ast.parse(path.read_text(), str(path)), rel)
    assert not offences, "\n".join(offences)


@pytest.mark.parametrize("source", [
    "import struct\ndef f(fh):\n    (n,) = struct.unpack('<Q', fh.read(8))\n",
    "def f(fh):\n    n = int.from_bytes(fh.read(8), 'little')\n",
    "def f(head):\n    return head.get('__metadata__')\n",
    "import hashlib\ndef f(p):\n    return hashlib.sha256(p.read_bytes()).hexdigest()\n",
    "import hashlib\ndef f(fh):\n    h = hashlib.sha256()\n    for b in iter(lambda: fh.read(1 << 20), b''):\n        h.update(b)\n",
])
def test_the_scan_sees_each_kind(source: str) -> None:
    assert _offences(ast.parse(source), "x.py")


# ----------------------------------------------------------------------------- the Markdown table


def test_a_table_keeps_its_shape_whatever_its_cells() -> None:
    """Read back by markdown-it's GFM table parser: every row has the header's cells, each cell's text as given."""
    markdown_it = pytest.importorskip("markdown_it")
    from harness.io.md_table import md_table

    rows = [["a|b", 1.5], ["line\nbreak", ""], [r"already \| escaped", "`x|y`"]]
    lines = md_table(["name", "value"], rows)
    assert lines[:2] == ["| name | value |", "|---|---|"] and lines[3] == "| line break | |"
    tokens = markdown_it.MarkdownIt("commonmark").enable("table").parse("\n".join(lines) + "\n")
    cells = [t.children[0].content if t.children else "" for t in tokens if t.type == "inline"]
    assert cells == ["name", "value", "a|b", "1.5", "line break", "", "already | escaped", "x|y"]  # the code span holds x|y
    with pytest.raises(ValueError, match="expected 2 cells, found 1"):
        md_table(["name", "value"], [["only one"]])


def test_aligned_table_pads_every_column() -> None:
    """The ladder's form: each column as wide as its widest cell, the rule as wide (two spaces of padding)."""
    from harness.io.md_table import md_table

    assert md_table(["name", "v"], [["a", "10.5"], ["bcdef", ""]], aligned=True) == [
        "| name  | v    |", "|-------|------|", "| a     | 10.5 |", "| bcdef |      |"]


def _hand_tables(tree: ast.AST, rel: str) -> list[str]:
    """Lines of a Markdown table assembled by hand: a string that opens a row (``"| "``) or a rule (``"|---"``),
    one that closes a row (``" |"``), or cells joined with ``" | "``. Docstrings are prose and not looked at."""
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and (node.value.startswith(("| ", "|-", "|:")) or node.value.endswith(" |")):
            found.append(f"{rel}:{node.lineno}: a Markdown table line built by hand: {node.value[:40]!r} "
                         "(use harness.io.md_table.md_table)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
                and isinstance(node.func.value, ast.Constant) and str(node.func.value.value).strip() == "|":
            found.append(f"{rel}:{node.lineno}: Markdown cells joined by hand (use harness.io.md_table.md_table)")
    return found


def test_one_markdown_table_helper() -> None:
    offences = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel != "io/md_table.py":
            offences += _hand_tables(ast.parse(path.read_text(), str(path)), rel)
    assert not offences, "\n".join(offences)


@pytest.mark.parametrize("source", [
    'def f(a, b):\n    return [f"| {a} | {b} |", "|---|---|"]\n',
    'def f(a, b):\n    return f"{a} | {b} |"\n',
    'def f(cells):\n    return "| " + " | ".join(cells) + " |"\n',
    'def f(cells):\n    return "|".join(cells)\n',
    'RULE = "|:---|---:|"\n',
])
def test_the_table_scan_sees_each_kind(source: str) -> None:
    assert _hand_tables(ast.parse(source), "x.py")


def test_the_table_scan_leaves_prose_and_types_alone() -> None:
    source = '"""A table: ``| a | b |``."""\nX = "int | None"\nY = "auto | inductor | eager"\n'
    assert _hand_tables(ast.parse(source), "x.py") == []
