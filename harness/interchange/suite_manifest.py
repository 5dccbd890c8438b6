"""The published suite read in place: the parent manifest, its token files and its shard views.

Reasoning: docs/interchange.md §"The suite read in place".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness import PROTOCOL_VERSION
from harness.errors import VerificationError
from harness.inputs.interchange_layout import HEX64_RE, SHARD_VIEW_RE, SUITE_MANIFEST, SUITE_SCHEMAS, shard_view_name
from harness.inputs.suite import ContextInfo, ShardInfo, Suite
from harness.interchange.manifest_read import read_manifest
from harness.io.hashing import sha256_bytes, sha256_file, tokens_sha256
from harness.io.jsonio import read_json


@dataclass(frozen=True)
class PublishedSuite:
    """A verified published suite.

    suite: the suite as this project uses it (tokens, contexts, shards from the views).
    manifest: the parent manifest as read.
    custody: the published digests it was verified against (``suite_manifest_sha256``,
        ``suite_token_sha256``, ``shard_views``: shard -> {suite_token_sha256, manifest_sha256}).
    """

    suite: Suite
    manifest: dict[str, Any]
    custody: dict[str, Any]


def published_digest(token_sha256s: list[str]) -> str:
    """A manifest's ``suite_token_sha256``: sha256 of its rows' ``token_sha256`` strings concatenated."""
    return sha256_bytes("".join(token_sha256s).encode())


def ids_digest(ids: list[int]) -> str:
    """A context's ``token_sha256``: sha256 of ``json.dumps(ids)``."""
    return sha256_bytes(json.dumps(ids).encode())


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _rows(mf: Path, doc: Any) -> list[dict[str, Any]]:
    if not isinstance(doc, dict) or doc.get("schema") not in SUITE_SCHEMAS:
        raise VerificationError(mf, "schema", " or ".join(SUITE_SCHEMAS), doc.get("schema") if isinstance(doc, dict) else type(doc).__name__)
    rows = doc.get("context_index")
    if not isinstance(rows, list) or not rows:
        raise VerificationError(mf, "context_index", "a non-empty list of contexts", type(rows).__name__)
    if doc.get("contexts") != len(rows):
        raise VerificationError(mf, "contexts (the rows of context_index)", len(rows), doc.get("contexts"))
    for pos, row in enumerate(rows):
        if not isinstance(row, dict):
            raise VerificationError(mf, f"context_index[{pos}]", "an object", type(row).__name__)
        for key in ("index", "file", "token_sha256", "source_cluster", "stratum"):
            if key not in row:
                raise VerificationError(mf, f"context_index[{pos}].{key}", "present", "missing")
        if not _is_int(row["index"]) or row["index"] < 0:
            raise VerificationError(mf, f"context_index[{pos}].index", "an integer >= 0", row["index"])
        if not isinstance(row["token_sha256"], str) or not HEX64_RE.match(row["token_sha256"]):
            raise VerificationError(mf, f"context_index[{pos}].token_sha256", "64 lowercase hex digits", row["token_sha256"])
    digest = published_digest([r["token_sha256"] for r in rows])
    if doc.get("suite_token_sha256") != digest:
        raise VerificationError(mf, "suite_token_sha256 (sha256 of the rows' token_sha256, in order)", digest,
                                doc.get("suite_token_sha256"))
    return rows


def _token_file(root: Path, row: dict[str, Any], mf: Path, pos: int) -> Path:
    name = row["file"]
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or ".." in Path(name).parts:
        raise VerificationError(mf, f"context_index[{pos}].file", "a relative path inside the suite folder", name)
    p = root / name
    if not p.resolve().is_relative_to(root.resolve()):
        raise VerificationError(p, "token file leaves the suite folder", f"a file inside {root}", str(p.resolve()))
    return p


def _read_ids(p: Path, row: dict[str, Any], n_ctx: int) -> list[int]:
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise VerificationError(p, "token file", "present", "missing") from None
    try:
        ids = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise VerificationError(p, f"not a JSON list of token ids ({e})") from None
    if not isinstance(ids, list) or not all(_is_int(i) and 0 <= i < 2**32 for i in ids):
        raise VerificationError(p, "content", "a JSON list of token ids (integers >= 0)", type(ids).__name__)
    if len(ids) != n_ctx:
        raise VerificationError(p, "token count (the suite's context_length)", n_ctx, len(ids))
    digest = ids_digest(ids)
    if digest != row["token_sha256"]:
        raise VerificationError(p, "token_sha256 (sha256 of json.dumps(ids))", row["token_sha256"], digest)
    return ids


def _views(root: Path, rows: list[dict[str, Any]], n_ctx: int) -> tuple[list[tuple[int, int]], dict[str, Any]]:
    """The shard views as consecutive ``(start, stop)`` slices of the parent, and their digests."""
    folders = sorted(p for p in root.iterdir() if p.is_dir() and SHARD_VIEW_RE.match(p.name))
    if not folders:
        return [(0, len(rows))], {}
    slices: list[tuple[int, int]] = []
    custody: dict[str, Any] = {}
    start = 0
    for k, folder in enumerate(folders):
        mf = folder / SUITE_MANIFEST
        if folder.name != shard_view_name(k):
            raise VerificationError(folder, "shard view name (views numbered from 0 without gaps)", shard_view_name(k), folder.name)
        doc = read_json(mf)
        view = _rows(mf, doc)
        stop = start + len(view)
        parent = rows[start:stop]
        if stop > len(rows) or view != parent:
            first = next((i for i, (a, b) in enumerate(zip(view, parent)) if a != b), min(len(view), len(parent)))
            raise VerificationError(mf, f"shard view rows (a slice of the parent suite, contexts {start}..{stop - 1})",
                                    parent[first] if first < len(parent) else "no more parent rows",
                                    view[first] if first < len(view) else "no more view rows",
                                    "a shard view must be a consecutive, unmodified slice of the parent")
        if doc.get("context_length") != n_ctx:
            raise VerificationError(mf, "context_length (the parent's)", n_ctx, doc.get("context_length"))
        slices.append((start, stop))
        custody[str(k)] = {"suite_token_sha256": doc["suite_token_sha256"], "manifest_sha256": sha256_file(mf)}
        start = stop
    if start != len(rows):
        raise VerificationError(root / SUITE_MANIFEST, "contexts covered by the shard views", len(rows), start,
                                "the views must cover the parent suite exactly once")
    return slices, custody


def load_published_suite(root: Path) -> PublishedSuite:
    """Read and verify the published suite folder ``root`` in place (docs/interchange.md §"The suite read in place")."""
    mf = root / SUITE_MANIFEST
    checked = read_manifest(mf)  # the manifest's own fields (counts, partitions, leaks) before any token file is opened
    doc = read_json(mf)
    rows = _rows(mf, doc)
    n_ctx = doc.get("context_length")
    if not _is_int(n_ctx) or n_ctx < 2:
        raise VerificationError(mf, "context_length", "an integer >= 2", n_ctx)
    for pos, row in enumerate(rows):
        if row["index"] != pos:
            raise VerificationError(mf, f"context_index[{pos}].index (its position in the parent suite)", pos, row["index"])
    tokens = np.empty((len(rows), n_ctx), dtype="<u4")
    for pos, row in enumerate(rows):
        tokens[pos] = _read_ids(_token_file(root, row, mf, pos), row, n_ctx)
    slices, views = _views(root, rows, n_ctx)
    contexts = [ContextInfo(index=pos, source_cluster=str(r["source_cluster"]), stratum=str(r["stratum"]),
                            document=str(r["file"]), start_token=0) for pos, r in enumerate(rows)]
    shards = [ShardInfo(index=k, start=a, stop=b, sha256=tokens_sha256(tokens[a:b])) for k, (a, b) in enumerate(slices)]
    tok_sha = doc.get("tokenizer_sha256") or (checked.model_identity or {}).get("tokenizer_sha256")  # /6: model_identity
    suite = Suite(root=root, n_ctx=n_ctx, vocab_size=int(tokens.max()) + 1,
                  tokenizer_sha256=tok_sha if isinstance(tok_sha, str) else "",
                  protocol_version=PROTOCOL_VERSION, contexts=contexts, shards=shards,
                  suite_token_sha256=tokens_sha256(tokens), tokens=tokens, meta={"published": True, "published_token_sha256": [r["token_sha256"] for r in rows]})
    custody = {"suite_manifest_sha256": sha256_file(mf), "suite_token_sha256": doc["suite_token_sha256"], "shard_views": views}
    return PublishedSuite(suite=suite, manifest=doc, custody=custody)


def load_any_suite(path: Path, verify: bool = True) -> Suite:
    """A suite folder of this project (``suite.json``) or of the published layout (``suite-manifest.json``).

    The published form is always verified (its token files are its only copy of the ids)."""
    if (path / SUITE_MANIFEST).is_file() and not (path / "suite.json").is_file():
        return load_published_suite(path).suite
    return Suite.load(path, verify=verify)


def shard_view_digest(suite: Suite, shard: int) -> str:
    """The published ``suite_token_sha256`` of shard ``shard``'s view: its rows' ``token_sha256``, chained."""
    return published_digest([ids_digest([int(t) for t in suite.tokens[i]]) for i in suite.shard_indices(shard)])
