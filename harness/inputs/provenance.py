"""Where every suite document comes from: sha256, source and licence (docs/design.md, section 2).

A suite records, for every document it was cut from, a :class:`DocumentRecord` in ``suite.json``
(``documents``: ``{relative path: {sha256, bytes, source, licence}}``), so a third party holding the
texts can prove they are the same texts, check contamination against their own training data, and
see under which licence each text may be redistributed.

Reasoning: docs/design.md §"Provenance of the suite's documents".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from harness.errors import FidelityError, VerificationError
from harness.io.hashing import sha256_bytes, sha256_file
from harness.io.jsonio import read_json
from harness.io.schema import Closed, MapOf, Nullable, OneOf, Optional, check

PROVENANCE_FILE = "provenance.json"
PROVENANCE_SCHEMA = "fidelity.corpus-provenance/1"


class DocumentRecord(TypedDict):
    """One document of a suite's corpus, as stored in ``suite.json`` ``documents``.

    sha256: sha256 of the document file's bytes (UTF-8 text, as tokenized).
    bytes: the file's size in bytes.
    source: where the text was taken from (a URL, a package path), or ``None`` if not declared.
    licence: the licence it is distributed under (SPDX id where there is one), or ``None``.
    """

    sha256: str
    bytes: int
    source: str | None
    licence: str | None


@dataclass(frozen=True)
class Attribution:
    """Source and licence of one document (either may be unknown)."""

    source: str | None
    licence: str | None


#: One document's attribution in the sidecar (harness.io.schema): either key may be absent or null.
ATTRIBUTION_SCHEMA = Closed({"source": Optional(Nullable(str)), "licence": Optional(Nullable(str))})
#: ``provenance.json`` as the harness reads it: closed, this version.
SIDECAR_SCHEMA = Closed({"schema": OneOf(PROVENANCE_SCHEMA), "default": Optional(ATTRIBUTION_SCHEMA),
                         "documents": Optional(MapOf(ATTRIBUTION_SCHEMA))})
#: One :class:`DocumentRecord` as ``suite.json`` ``documents`` holds it.
RECORD_SCHEMA = Closed({"sha256": str, "bytes": int, "source": Nullable(str), "licence": Nullable(str)})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _attribution(raw: dict[str, Any]) -> Attribution:
    return Attribution(raw.get("source"), raw.get("licence"))


def load_provenance(path: str | Path) -> tuple[Attribution, dict[str, Attribution]]:
    """Read a ``provenance.json`` sidecar (:data:`SIDECAR_SCHEMA`, strict JSON): the default attribution and
    the per-document ones."""
    path = Path(path)
    if not path.is_file():
        raise FidelityError(f"{path}: provenance sidecar not found")
    doc = read_json(path)
    check(doc, SIDECAR_SCHEMA, path)
    return _attribution(doc.get("default", {})), {str(k): _attribution(v) for k, v in doc.get("documents", {}).items()}


def document_records(
    corpus_dir: str | Path,
    documents: list[str],
    *,
    provenance: str | Path | None = None,
    source: str | None = None,
    licence: str | None = None,
) -> dict[str, DocumentRecord]:
    """One record per document (sorted): sha256 and size of the file, source and licence.

    ``provenance`` defaults to ``<corpus>/provenance.json`` when that file exists. Precedence per
    field: the sidecar's per-document entry, then its ``default``, then the ``source``/``licence``
    arguments. A sidecar entry for a document that is not in the corpus is refused (a typo would
    otherwise silently attribute nothing).
    """
    root = Path(corpus_dir)
    side = Path(provenance) if provenance is not None else root / PROVENANCE_FILE
    default: Attribution = Attribution(None, None)
    per_doc: dict[str, Attribution] = {}
    if provenance is not None or side.is_file():
        default, per_doc = load_provenance(side)
    stray = sorted(d for d in per_doc if not (root / d).is_file())
    if stray:
        raise VerificationError(side, "documents", f"paths of documents under {root}", stray[:5])
    known = set(documents)
    out: dict[str, DocumentRecord] = {}
    for rel in sorted(known):
        p = root / rel
        a = per_doc.get(rel, Attribution(None, None))
        out[rel] = DocumentRecord(
            sha256=sha256_file(p),
            bytes=p.stat().st_size,
            source=a.source or default.source or source,
            licence=a.licence or default.licence or licence,
        )
    return out


def check_records(path: Path, records: Any) -> None:
    """Check a ``documents`` block read from ``suite.json`` (a hand edit fails here, not later): every record
    matches :data:`RECORD_SCHEMA`, its sha256 is 64 lower-case hex digits, its size is not negative, and its
    path is relative and inside the corpus."""
    check(records, MapOf(RECORD_SCHEMA), path, "documents")
    for rel, r in records.items():
        if rel.startswith("/") or ".." in rel.split("/") or "\\" in rel or not rel:
            raise VerificationError(path, f"documents[{rel!r}]", "a relative path inside the corpus", rel)
        if not _SHA256.match(r["sha256"]):
            raise VerificationError(path, f"documents.{rel}.sha256", "64 lower-case hex digits", repr(r["sha256"]))
        if r["bytes"] < 0:
            raise VerificationError(path, f"documents.{rel}.bytes", "a size >= 0", r["bytes"])


@dataclass(frozen=True)
class CorpusCheck:
    """Outcome of re-deriving a suite's contexts from its texts.

    documents: documents checked (every one's sha256 matched, else the check raised).
    matching: indices of contexts whose re-tokenized ids equal the authoritative ids.
    differing: ``(index, first differing position)`` of the contexts that do not match.
    """

    documents: int
    matching: list[int]
    differing: list[tuple[int, int]]


def verify_documents(suite: Any, corpus_dir: str | Path) -> dict[str, bytes]:
    """Check every recorded document's bytes against its sha256; returns ``{path: bytes}``.

    A missing document or a different sha256 raises ``VerificationError`` naming the file.
    A suite without a ``documents`` block cannot be checked and is refused (rebuild it)."""
    root = Path(corpus_dir)
    records = suite.meta.get("documents")
    if not records:
        raise VerificationError(suite.root / "suite.json", "documents (per-document sha256, source, licence)", "present",
                                "absent", "rebuild the suite with this harness's `fidelity suite build`")
    used = {c.document for c in suite.contexts}
    out: dict[str, bytes] = {}
    for rel in sorted(records):
        p = root / rel
        if not p.is_file():
            if rel in used:
                raise VerificationError(p, "document of the suite", "present", "missing")
            raise VerificationError(p, "document listed in suite.json", "present", "missing")
        data = p.read_bytes()
        found = sha256_bytes(data)
        if found != records[rel]["sha256"]:
            raise VerificationError(p, "document sha256 (suite.json documents)", records[rel]["sha256"], found)
        out[rel] = data
    missing = sorted(used - set(records))
    if missing:
        raise VerificationError(suite.root / "suite.json", "documents", "a record for every context's document", f"none for {missing[0]}")
    return out


def rederive_contexts(suite: Any, corpus_dir: str | Path, tokenizer_json: str | Path) -> CorpusCheck:
    """Re-tokenize every context's document and compare the window with the suite's ids.

    The tokenizer file must be the suite's (``tokenizer.sha256``); documents must match their
    sha256. Mismatching windows are listed, never refused (see docs/design.md §"Provenance of the suite's documents")."""
    from tokenizers import Tokenizer

    tok_path = Path(tokenizer_json)
    if not tok_path.is_file():
        raise FidelityError(f"{tok_path}: tokenizer file not found")
    found = sha256_file(tok_path)
    if found != suite.tokenizer_sha256:
        raise VerificationError(tok_path, "tokenizer sha256 (suite.json tokenizer.sha256)", suite.tokenizer_sha256, found)
    texts = verify_documents(suite, corpus_dir)
    tokenizer = Tokenizer.from_file(str(tok_path))
    ids_by_doc: dict[str, np.ndarray] = {}
    matching: list[int] = []
    differing: list[tuple[int, int]] = []
    for c in suite.contexts:
        if c.document not in ids_by_doc:
            ids = tokenizer.encode(texts[c.document].decode("utf-8"), add_special_tokens=False).ids
            ids_by_doc[c.document] = np.asarray(ids, dtype=np.int64)
        window = ids_by_doc[c.document][c.start_token : c.start_token + suite.n_ctx]
        want = suite.tokens[c.index].astype(np.int64)
        n = min(len(window), len(want))
        diff = np.flatnonzero(window[:n] != want[:n])
        if len(window) == len(want) and diff.size == 0:
            matching.append(c.index)
        else:
            differing.append((c.index, int(diff[0]) if diff.size else n))
    return CorpusCheck(len(texts), matching, differing)


def format_corpus_check(suite: Any, corpus_dir: str | Path, check: CorpusCheck) -> list[str]:
    """Human-readable lines for :func:`rederive_contexts`'s result (what matched, what did not)."""
    from collections import Counter

    records = suite.meta.get("documents") or {}
    licences = Counter(str(r["licence"]) for r in records.values())
    lines = [
        (f"{corpus_dir}: {check.documents} documents match their sha256 in suite.json "
         f"(licences: {', '.join(f'{k} x{n}' for k, n in sorted(licences.items()))})"),
        f"contexts re-derived from the texts: {len(check.matching)}/{suite.n_contexts} match the authoritative token ids",
    ]
    if check.differing:
        shown = ", ".join(f"{i} (from token {pos})" for i, pos in check.differing[:10])
        more = f" and {len(check.differing) - 10} more" if len(check.differing) > 10 else ""
        lines.append(f"contexts that do not match: {shown}{more}; the tokenizer does not round-trip these texts "
                     "(the suite's stored token ids stay authoritative)")
    return lines
