"""Corpora people already have, turned into a corpus folder a suite is cut from (``fidelity suite build``).

Reasoning: docs/design.md §"Corpus sources".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import FidelityError, MissingPackageError
from harness.inputs.provenance import PROVENANCE_FILE, PROVENANCE_SCHEMA
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.hashing import sha256_bytes, sha256_file

DATA_SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
SPLIT_RULES = ("blank-lines", "lines", "regex:PATTERN")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Materialized:
    """A source written as a corpus folder: where, how many documents, and the ``corpus_source`` record."""

    folder: Path
    documents: int
    record: dict[str, Any]
    #: Documents written without a licence (the build warns).
    unlicensed: int


def _doc_name(raw: Any, row: int, seen: set[str]) -> str:
    base = _SAFE.sub("_", str(raw)).strip("._") if raw is not None else ""
    name = f"{base or f'row-{row:06d}'}.txt"
    if name in seen:
        raise FidelityError(f"document id {raw!r} (row {row}) appears twice: expected unique values in the id column")
    seen.add(name)
    return name


def _write(out: Path, docs: Iterator[tuple[str, str]], source: str, licence: str | None, record: dict[str, Any]) -> Materialized:
    if out.exists() and any(out.iterdir()):
        raise FidelityError(f"{out}: --corpus-out exists and is not empty (the source's documents are written whole)")
    files: dict[Path, str | bytes] = {}
    attributions: dict[str, dict[str, str | None]] = {}
    for name, text in docs:
        if not text.strip():
            continue
        files[out / name] = text.encode("utf-8")
        attributions[name] = {"source": f"{source}: {name.removesuffix('.txt')}", "licence": licence}
    if not files:
        raise FidelityError(f"{source}: no non-empty documents")
    files[out / PROVENANCE_FILE] = dumps_json({"schema": PROVENANCE_SCHEMA, "documents": attributions})
    atomic_write_files(files)
    return Materialized(out, len(attributions), record, 0 if licence else len(attributions))


# ----------------------------------------------------------------------------- chat template
def chat_formatter(model_dir: Path) -> tuple[Callable[[Any], str], dict[str, Any]]:
    """``(format, record)``: ``format(value)`` is the tokenizer's chat template applied to a conversation
    (a list of ``{role, content}``) or to a text as one user message, not tokenized; ``record`` names the
    template by sha256 and the tokenizer configuration it came from."""
    from transformers import AutoTokenizer

    cfg = model_dir / "tokenizer_config.json"
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))  # never remote code (the default)
    except (OSError, ValueError) as exc:
        raise FidelityError(f"{model_dir}: --chat-template: expected a tokenizer folder (tokenizer.json + "
                            f"tokenizer_config.json), found an error: {exc}") from None
    template = getattr(tok, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise FidelityError(f"{cfg}: --chat-template: expected a chat_template, found none")

    def fmt(value: Any) -> str:
        messages = value if isinstance(value, list) else [{"role": "user", "content": str(value)}]
        return str(tok.apply_chat_template(messages, tokenize=False))

    record = {"template_sha256": sha256_bytes(template.encode("utf-8")),
              "tokenizer_config_sha256": sha256_file(cfg) if cfg.is_file() else None, "from": str(model_dir)}
    return fmt, record


# ----------------------------------------------------------------------------- datasets
def _data_files(path: Path) -> list[Path]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES)
    kinds = {DATA_SUFFIXES.get(p.suffix) for p in files}
    if not files or None in kinds:
        raise FidelityError(f"{path}: expected a datasets folder (save_to_disk) or .parquet/.jsonl/.json/.arrow files, "
                            f"found {'no data files' if not files else ', '.join(sorted(p.suffix for p in files))}")
    if len(kinds) > 1:
        raise FidelityError(f"{path}: expected data files of one format, found {sorted(str(k) for k in kinds)}")
    return files


def load_rows(path: Path, split: str | None) -> tuple[Any, dict[str, Any]]:
    """The rows of a local ``datasets`` source and what identifies them (fingerprint, data files' sha256)."""
    try:
        import datasets
    except ImportError:  # an extra, not part of the core install
        raise MissingPackageError.extra("datasets", "datasets", needed_for=f"{path}: reading a datasets source") from None

    saved = path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file())
    if saved:
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split is None or split not in ds:
                raise FidelityError(f"{path}: a DatasetDict: expected --split of {sorted(ds)}, found {split!r}")
            ds = ds[split]
        files = sorted(p for p in path.rglob("*.arrow") if p.is_file())
    else:
        files = _data_files(path)
        builder = DATA_SUFFIXES[files[0].suffix]
        ds = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")
    ident = {"fingerprint": getattr(ds, "_fingerprint", None), "format": "save_to_disk" if saved else
             DATA_SUFFIXES[files[0].suffix], "files": {f.relative_to(path).as_posix() if f != path else f.name: sha256_file(f)
                                                        for f in files}}
    return ds, ident


def from_datasets(path: Path, out: Path, *, text_column: str, id_column: str | None = None, split: str | None = None,
                  name: str | None = None, revision: str | None = None, licence: str | None = None,
                  chat_template: Path | None = None) -> Materialized:
    """Write every row of a local ``datasets`` source as one document of a corpus folder ``out``."""
    ds, ident = load_rows(path, split)
    columns = list(ds.column_names)
    for col, what in ((text_column, "--text-column"), (id_column, "--id-column")):
        if col is not None and col not in columns:
            raise FidelityError(f"{path}: {what}: expected one of the columns {columns}, found {col!r}")
    info_licence = getattr(ds.info, "license", None) or None
    licence = licence or info_licence
    fmt, template = chat_formatter(chat_template) if chat_template is not None else (None, None)
    label = name or path.name
    record = {"kind": "datasets", "name": label, "revision": revision, **ident, "split": split,
              "text_column": text_column, "id_column": id_column, "rows": len(ds), "licence": licence,
              "chat_template": template}
    seen: set[str] = set()

    def docs() -> Iterator[tuple[str, str]]:
        for i, row in enumerate(ds):
            value = row[text_column]
            if fmt is None and not isinstance(value, str):
                raise FidelityError(f"{path}: row {i}: --text-column {text_column!r}: expected text, found "
                                    f"{type(value).__name__} (a conversation needs --chat-template)")
            yield _doc_name(row[id_column] if id_column else None, i, seen), (fmt(value) if fmt else value)

    source = f"{label}@{revision or ident['fingerprint']}"
    return _write(out, docs(), source, licence, record)


# ----------------------------------------------------------------------------- one long file
def split_text(text: str, rule: str) -> list[str]:
    """``text`` cut into documents by ``rule`` (see docs/design.md §"Corpus sources"); empty pieces are dropped."""
    if rule == "blank-lines":
        pieces = re.split(r"\n[ \t]*\n", text)
    elif rule == "lines":
        pieces = text.splitlines()
    elif rule.startswith("regex:") and len(rule) > len("regex:"):
        try:
            pat = re.compile(rule.removeprefix("regex:"), re.MULTILINE)
        except re.error as exc:
            raise FidelityError(f"--split-rule {rule!r}: not a valid regular expression ({exc})") from None
        starts = sorted({0, *(m.start() for m in pat.finditer(text))})
        pieces = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]
    else:
        raise FidelityError(f"--split-rule: expected one of {', '.join(SPLIT_RULES)}, found {rule!r}")
    return [p.strip("\n") for p in pieces if p.strip()]


def from_long_file(path: Path, out: Path, *, rule: str, name: str | None = None, licence: str | None = None,
                   chat_template: Path | None = None) -> Materialized:
    """Write the documents ``rule`` cuts ``path`` into as a corpus folder ``out``."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise FidelityError(f"{path}: --split-file not found") from None
    except UnicodeDecodeError as exc:
        raise FidelityError(f"{path}: expected UTF-8 text, found an undecodable byte at offset {exc.start}") from None
    fmt, template = chat_formatter(chat_template) if chat_template is not None else (None, None)
    pieces = split_text(text, rule)
    width = max(5, len(str(len(pieces))))
    label = name or path.name
    sha = sha256_file(path)
    record: dict[str, Any] = {"kind": "file", "name": label, "file": path.name, "sha256": sha, "split_rule": rule,
              "documents": len(pieces), "licence": licence, "chat_template": template}
    docs = ((f"{path.stem}-{i:0{width}d}.txt", fmt(p) if fmt else p) for i, p in enumerate(pieces))
    return _write(out, docs, f"{label}@sha256:{sha[:16]}", licence, record)

