"""The suite: fixed token contexts, their provenance, shards and hashes (docs/design.md, sections 2-3).

Reasoning: docs/design.md §"The suite".
"""

from __future__ import annotations

import math
import os
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness import PROTOCOL_VERSION
from harness.errors import FidelityError, VerificationError
from harness.inputs.provenance import PROVENANCE_FILE, check_records, document_records
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.hashing import sha256_bytes, sha256_file, tokens_sha256
from harness.io.jsonio import read_json

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SCHEMA = "fidelity.suite/1"
SUITE_JSON = "suite.json"
TOKENS_FILE = "tokens.npy"
_SKIP_PREFIXES = ("license", "copying")
_BINARY_SUFFIXES = {".npy", ".npz", ".safetensors", ".bin", ".pt", ".pth", ".gz", ".zip", ".png", ".jpg", ".pdf"}


@dataclass(frozen=True)
class ContextInfo:
    """Provenance of one context.

    index: position of the context in the suite (row of the token array).
    source_cluster: unit of statistical independence (the document, or a group of documents).
    stratum: content type, the first folder below the corpus root ("root" if none).
    document: the document's path relative to the corpus root (POSIX separators).
    start_token: offset of the context's first token within the tokenized document.
    """

    index: int
    source_cluster: str
    stratum: str
    document: str
    start_token: int


@dataclass(frozen=True)
class ShardInfo:
    """One shard: contexts ``[start, stop)``; ``sha256`` is ``tokens_sha256`` of those rows."""

    index: int
    start: int
    stop: int
    sha256: str

    @property
    def n_contexts(self) -> int:
        return self.stop - self.start


@dataclass
class Suite:
    """A loaded (and normally verified) suite.

    root: the suite folder.
    n_ctx: tokens per context; rows ``0 .. n_ctx-2`` of each context are scored.
    vocab_size: vocabulary size of the tokenizer that produced the ids (every id is below it).
    tokenizer_sha256: sha256 of the tokenizer.json file.
    protocol_version: measurement protocol the suite was built for.
    contexts: one ``ContextInfo`` per row of ``tokens``.
    shards: consecutive, non-overlapping shards covering every context.
    suite_token_sha256: ``tokens_sha256`` of the whole token array.
    tokens: ``uint32`` array ``[n_contexts, n_ctx]``.
    """

    root: Path
    n_ctx: int
    vocab_size: int
    tokenizer_sha256: str
    protocol_version: int
    contexts: list[ContextInfo]
    shards: list[ShardInfo]
    suite_token_sha256: str
    tokens: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_contexts(self) -> int:
        return len(self.contexts)

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def shard(self, k: int) -> ShardInfo:
        """The shard with index ``k``; ``FidelityError`` if there is none."""
        if not 0 <= k < len(self.shards):
            raise FidelityError(f"{self.root}: shard {k} out of range: the suite has {len(self.shards)} shards (0-{len(self.shards) - 1})")
        return self.shards[k]

    def shard_indices(self, k: int) -> list[int]:
        """Context indices of shard ``k``."""
        s = self.shard(k)
        return list(range(s.start, s.stop))

    def context_indices(self, shards: Sequence[int] | str | None = None) -> list[int]:
        """Context indices of the given shards: a list of shard numbers, a spec such as
        ``"0,2-3"``, or ``None`` for every shard (each shard number is checked)."""
        if shards is None or isinstance(shards, str):
            shard_list = self.parse_shards(shards)
        else:
            shard_list = [self.shard(k).index for k in shards]
        return [i for k in shard_list for i in self.shard_indices(k)]

    def parse_shards(self, spec: str | None) -> list[int]:
        """Parse a shard spec such as ``"0,2-3"`` against this suite (``None``/``"all"``: every shard)."""
        return parse_shard_spec(spec, self.n_shards)

    @classmethod
    def load(cls, path: str | Path, verify: bool = True) -> Suite:
        """Load a suite folder (or its ``suite.json``); with ``verify`` re-hash everything."""
        return load_suite(path, verify=verify)


def parse_shard_spec(spec: str | None, n_shards: int) -> list[int]:
    """Parse ``"0,2-3"`` into sorted unique shard indices; ``None``, ``""`` or ``"all"`` mean all.

    Raises ``FidelityError`` naming the offending item for malformed or out-of-range entries.
    """
    if spec is None or spec.strip() in ("", "all"):
        return list(range(n_shards))
    out: set[int] = set()
    for item in spec.split(","):
        item = item.strip()
        try:
            if "-" in item:
                a_s, b_s = item.split("-", 1)
                a, b = int(a_s), int(b_s)
                if a > b:
                    raise FidelityError(f"shard range {item!r} is reversed: write {b}-{a}")
                rng = range(a, b + 1)
            else:
                rng = range(int(item), int(item) + 1)
        except ValueError:
            raise FidelityError(f"bad shard spec item {item!r} in {spec!r}: expected N or N-M, e.g. 0,2-3") from None
        for k in rng:
            if not 0 <= k < n_shards:
                raise FidelityError(f"shard {k} (from {item!r}) out of range: the suite has {n_shards} shards, valid 0-{n_shards - 1}")
            out.add(k)
    return sorted(out)


# ----------------------------------------------------------------------------- loading


def manifest_sha256(doc: dict[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "manifest_sha256"}
    return sha256_bytes(dumps_json(body).encode("utf-8"))


def load_suite(path: str | Path, verify: bool = True) -> Suite:
    """Load and (by default) verify a suite folder.

    Verification re-hashes the manifest, the token array and every shard, and checks schema,
    protocol version, dtype, shape, context indices, shard coverage and every id < vocab_size.
    Any mismatch raises ``VerificationError`` naming the file, the expected and the found value.
    """
    root = Path(path)
    if root.name == SUITE_JSON:
        root = root.parent
    sj = root / SUITE_JSON
    tf = root / TOKENS_FILE
    if not sj.is_file():
        raise VerificationError(sj, "suite manifest missing", hint="build one with `fidelity suite build`")

    doc = read_json(sj)
    if doc.get("schema") != SCHEMA:
        raise VerificationError(sj, "schema", SCHEMA, doc.get("schema"))
    if verify:
        expected = doc.get("manifest_sha256")
        found = manifest_sha256(doc)
        if expected != found:
            raise VerificationError(sj, "manifest_sha256 (a field was edited)", expected, found)
    if doc.get("protocol_version") != PROTOCOL_VERSION:
        raise VerificationError(sj, "protocol_version", PROTOCOL_VERSION, doc.get("protocol_version"))
    try:
        n_ctx = int(doc["n_ctx"])
        vocab = int(doc["tokenizer"]["vocab_size"])
        contexts = [ContextInfo(**c) for c in doc["contexts"]]
        shards = [ShardInfo(**s) for s in doc["shards"]]
        suite_sha = str(doc["suite_token_sha256"])
        tok_sha = str(doc["tokenizer"]["sha256"])
    except (KeyError, TypeError, ValueError) as e:
        raise VerificationError(sj, f"malformed field {e}") from None
    _check_field_types(sj, doc, contexts, shards)
    if "documents" in doc:
        check_records(sj, doc["documents"])
    if not tf.is_file():
        raise VerificationError(tf, "token array missing")
    try:
        tokens = np.load(tf, allow_pickle=False, mmap_mode=None)
    except (ValueError, OSError, EOFError) as e:
        raise VerificationError(tf, f"not a readable .npy array ({e})") from None
    if tokens.dtype != np.dtype("<u4"):
        raise VerificationError(tf, "dtype", "<u4", tokens.dtype.str)
    shape = (len(contexts), n_ctx)
    if tokens.shape != shape:
        raise VerificationError(tf, "shape", list(shape), list(tokens.shape))
    suite = Suite(root, n_ctx, vocab, tok_sha, int(doc["protocol_version"]), contexts, shards, suite_sha, tokens, meta=doc)
    if verify:
        _verify(suite, sj, tf)
    return suite


def _check_field_types(sj: Path, doc: dict[str, Any], contexts: list[ContextInfo], shards: list[ShardInfo]) -> None:
    """Every field has its documented type (so a hand-edited manifest fails here, not deep inside)."""

    def want(cond: bool, what: str, expected: str, found: Any) -> None:
        if not cond:
            raise VerificationError(sj, what, expected, found)

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    want(is_int(doc["n_ctx"]) and doc["n_ctx"] >= 2, "n_ctx", "an integer >= 2", doc["n_ctx"])
    want(is_int(doc["tokenizer"]["vocab_size"]) and doc["tokenizer"]["vocab_size"] >= 1, "tokenizer.vocab_size", "an integer >= 1", doc["tokenizer"]["vocab_size"])
    want(isinstance(doc["suite_token_sha256"], str), "suite_token_sha256", "a hex string", doc["suite_token_sha256"])
    want(isinstance(doc["tokenizer"]["sha256"], str), "tokenizer.sha256", "a hex string", doc["tokenizer"]["sha256"])
    for i, c in enumerate(contexts):
        ok = is_int(c.index) and is_int(c.start_token) and all(isinstance(v, str) for v in (c.source_cluster, c.stratum, c.document))
        want(ok, f"contexts[{i}]", "{index: int, source_cluster: str, stratum: str, document: str, start_token: int}", asdict(c))
    for k, sh in enumerate(shards):
        ok = is_int(sh.index) and is_int(sh.start) and is_int(sh.stop) and isinstance(sh.sha256, str)
        want(ok, f"shards[{k}]", "{index: int, start: int, stop: int, sha256: str}", asdict(sh))


def _verify(suite: Suite, sj: Path, tf: Path) -> None:
    found = tokens_sha256(suite.tokens)
    if found != suite.suite_token_sha256:
        raise VerificationError(tf, "suite_token_sha256", suite.suite_token_sha256, found)
    seen: dict[tuple[str, int], int] = {}
    for i, c in enumerate(suite.contexts):
        if c.index != i:
            raise VerificationError(sj, f"contexts[{i}].index", i, c.index)
        window = (c.document, c.start_token)
        if window in seen:  # one window twice would be scored, and bootstrapped, twice
            raise VerificationError(sj, f"contexts[{i}] (document, start_token)", "each window of a document once",
                                    f"{c.document!r} at token {c.start_token}, already contexts[{seen[window]}]")
        seen[window] = i
    pos = 0
    for k, s in enumerate(suite.shards):
        if s.index != k or s.start != pos or s.stop <= s.start:
            raise VerificationError(sj, f"shards[{k}] (overlapping, missing or empty)", f"index {k} starting at {pos}", f"index {s.index} [{s.start}, {s.stop})")
        pos = s.stop
        h = tokens_sha256(suite.tokens[s.start : s.stop])
        if h != s.sha256:
            raise VerificationError(tf, f"shard {k} sha256", s.sha256, h)
    if pos != suite.n_contexts:
        raise VerificationError(sj, "shards cover contexts", f"0-{suite.n_contexts}", f"0-{pos}")
    if suite.tokens.size and int(suite.tokens.max()) >= suite.vocab_size:
        raise VerificationError(tf, "token id below vocab_size", f"< {suite.vocab_size}", int(suite.tokens.max()))


# ----------------------------------------------------------------------------- building


def _is_skipped(rel: Path) -> bool:
    if any(part.startswith(".") for part in rel.parts):
        return True
    name = rel.name.lower()
    if rel.as_posix() == PROVENANCE_FILE:
        return True
    return name.startswith(_SKIP_PREFIXES) or rel.suffix.lower() in _BINARY_SUFFIXES


def list_documents(corpus_dir: str | Path) -> dict[str, str]:
    """Every usable text document below ``corpus_dir``: ``{relative posix path: text}``, sorted."""
    root = Path(corpus_dir)
    if not root.is_dir():
        raise FidelityError(f"{root}: corpus folder not found")
    docs: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            rel = p.relative_to(root)
            if _is_skipped(rel) or not p.is_file():
                continue
            data = p.read_bytes()
            if b"\x00" in data:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            docs[rel.as_posix()] = text
    return dict(sorted(docs.items()))


def _stratum(rel: str) -> str:
    parts = rel.split("/")
    return parts[0] if len(parts) > 1 else "root"


def _read_list(path: Path) -> list[str]:
    out = []
    for line in path.read_text("utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def split_shards(tokens: np.ndarray, n_shards: int) -> list[ShardInfo]:
    """The protocol's shard split: consecutive contexts, ceil(n_contexts / n_shards) per shard (the
    last may be shorter), each with the sha256 of its rows; a split that leaves a shard empty is refused."""
    n = int(tokens.shape[0])
    size = math.ceil(n / n_shards)
    shards = []
    for k in range(n_shards):
        a, b = k * size, min((k + 1) * size, n)
        if a >= b:
            raise FidelityError(f"{n_shards} shards of {size} leave shard {k} empty for {n} contexts: choose fewer shards")
        shards.append(ShardInfo(k, a, b, tokens_sha256(tokens[a:b])))
    return shards


def build_suite(
    corpus_dir: str | Path,
    tokenizer_json: str | Path,
    n_ctx: int,
    n_contexts: int,
    n_shards: int,
    seed: int,
    out: str | Path,
    grouping_file: str | Path | None = None,
    documents: str | Path | list[str] | None = None,
    *,
    provenance: str | Path | None = None,
    source: str | None = None,
    licence: str | None = None,
    corpus_source: dict[str, Any] | None = None,
) -> Suite:
    """Cut a suite from a corpus folder and write it to ``out`` (see docs/design.md §"The suite").

    ``documents`` restricts the suite to the listed relative paths (a file with one per line, or a
    list), e.g. a held-out split. ``provenance``/``source``/``licence`` attribute the documents
    (:func:`harness.inputs.provenance.document_records`). ``corpus_source``: how the corpus folder was made
    from a source people have (:mod:`harness.inputs.corpus_sources`), recorded as ``suite.json``
    ``corpus_source``. Raises ``FidelityError`` if the corpus has fewer non-overlapping
    windows than ``n_contexts`` or the geometry is invalid.
    """
    _check_geometry(n_ctx, n_contexts, n_shards)
    tok_path = Path(tokenizer_json)
    tokenizer, vocab = _load_tokenizer(tok_path)
    docs = _select_documents(corpus_dir, documents)
    grouping = _read_grouping(grouping_file)
    ids_by_doc, windows = _tokenize(docs, tokenizer, vocab, n_ctx)
    available = sum(len(w) for w in windows.values())
    if available < n_contexts:
        raise FidelityError(
            f"{corpus_dir}: corpus too small: {available} non-overlapping windows of {n_ctx} tokens available "
            f"in {len(docs)} documents, {n_contexts} contexts asked"
        )
    chosen = _choose_windows(list(docs), windows, n_contexts, seed)
    tokens, contexts = _cut(chosen, ids_by_doc, grouping, n_ctx)
    shards = split_shards(tokens, n_shards)

    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "protocol_version": PROTOCOL_VERSION,
        "n_ctx": n_ctx,
        "n_contexts": n_contexts,
        "n_shards": n_shards,
        "seed": seed,
        "tokenizer": {"sha256": sha256_file(tok_path), "vocab_size": vocab},
        "tokens_file": TOKENS_FILE,
        "tokens_dtype": "<u4",
        "suite_token_sha256": tokens_sha256(tokens),
        "contexts": [asdict(c) for c in contexts],
        "shards": [asdict(s) for s in shards],
        "documents": dict(document_records(corpus_dir, list(docs), provenance=provenance, source=source, licence=licence)),
    }
    if corpus_source is not None:
        doc["corpus_source"] = corpus_source
    doc["manifest_sha256"] = manifest_sha256(doc)
    return _write_suite(Path(out), tokens, doc)


def _check_geometry(n_ctx: int, n_contexts: int, n_shards: int) -> None:
    """A suite's context length, context count and shard count, each in its range."""
    if n_ctx < 2:
        raise FidelityError(f"n_ctx must be at least 2 (one scored position), got {n_ctx}")
    if n_contexts < 1:
        raise FidelityError(f"--contexts must be at least 1, got {n_contexts}")
    if not 1 <= n_shards <= n_contexts:
        raise FidelityError(f"--shards must be between 1 and the number of contexts ({n_contexts}), got {n_shards}")


def _load_tokenizer(tok_path: Path) -> tuple[Tokenizer, int]:
    """The ``tokenizer.json`` and its vocabulary size (added tokens included)."""
    from tokenizers import Tokenizer

    if not tok_path.is_file():
        raise FidelityError(f"{tok_path}: tokenizer file not found")
    try:
        tokenizer = Tokenizer.from_file(str(tok_path))
    except Exception as e:  # tokenizers raises a bare Exception on bad files
        raise FidelityError(f"{tok_path}: not a readable tokenizer.json ({e})") from None
    return tokenizer, tokenizer.get_vocab_size(with_added_tokens=True)


def _select_documents(corpus_dir: str | Path, documents: str | Path | list[str] | None) -> dict[str, str]:
    """The corpus's documents, restricted to ``documents`` (a file with one path per line, or a list) if given."""
    docs = list_documents(corpus_dir)
    if documents is not None:
        wanted = _read_list(Path(documents)) if isinstance(documents, (str, Path)) else list(documents)
        missing = [d for d in wanted if d not in docs]
        if missing:
            raise FidelityError(f"{documents}: {len(missing)} listed document(s) not found under {corpus_dir}: {missing[:5]}")
        docs = {d: docs[d] for d in sorted(set(wanted))}
    if not docs:
        raise FidelityError(f"{corpus_dir}: no text documents found")
    return docs


def _read_grouping(grouping_file: str | Path | None) -> dict[str, str]:
    """The grouping file's ``{relative document path: cluster name}``; empty without one."""
    grouping: dict[str, str] = {}
    if grouping_file is not None:
        gp = Path(grouping_file)

        grouping = read_json(gp)
        if not isinstance(grouping, dict) or not all(isinstance(v, str) for v in grouping.values()):
            raise FidelityError(f"{gp}: grouping file must be a JSON object {{\"relative/doc/path\": \"cluster-name\"}}")
    return grouping


def _tokenize(docs: dict[str, str], tokenizer: Tokenizer, vocab: int,
              n_ctx: int) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
    """Each document's token ids (no special tokens) and the starts of its non-overlapping ``n_ctx`` windows."""
    windows: dict[str, list[int]] = {}
    ids_by_doc: dict[str, np.ndarray] = {}
    for rel, text in docs.items():
        ids = np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        if ids.size and int(ids.max()) >= vocab:
            raise FidelityError(f"{rel}: token id {int(ids.max())} >= tokenizer vocab size {vocab}")
        ids_by_doc[rel] = ids
        windows[rel] = [i * n_ctx for i in range(len(ids) // n_ctx)]
    return ids_by_doc, windows


def _choose_windows(docs: list[str], windows: dict[str, list[int]], n_contexts: int,
                    seed: int) -> list[tuple[str, int]]:
    """``(document, start)`` of each context, in selection order: documents shuffled within their stratum,
    strata interleaved round-robin, one window per document per round (module docstring)."""
    rng = random.Random(seed)
    by_stratum: dict[str, list[str]] = {}
    for rel in docs:
        by_stratum.setdefault(_stratum(rel), []).append(rel)
    for s in sorted(by_stratum):
        rng.shuffle(by_stratum[s])
    order: list[str] = []
    queues = [list(by_stratum[s]) for s in sorted(by_stratum)]
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    pending = {rel: rng.sample(windows[rel], len(windows[rel])) for rel in order}
    chosen: list[tuple[str, int]] = []
    while len(chosen) < n_contexts:
        for rel in order:
            if pending[rel] and len(chosen) < n_contexts:
                chosen.append((rel, pending[rel].pop(0)))
    return chosen


def _cut(chosen: list[tuple[str, int]], ids_by_doc: dict[str, np.ndarray], grouping: dict[str, str],
         n_ctx: int) -> tuple[np.ndarray, list[ContextInfo]]:
    """The token array (``<u4``, one row per chosen window) and each context's provenance."""
    tokens = np.empty((len(chosen), n_ctx), dtype="<u4")
    contexts = []
    for i, (rel, start) in enumerate(chosen):
        tokens[i] = ids_by_doc[rel][start : start + n_ctx]
        contexts.append(ContextInfo(i, grouping.get(rel, rel), _stratum(rel), rel, start))
    return tokens, contexts


def _write_suite(out_dir: Path, tokens: np.ndarray, doc: dict[str, Any]) -> Suite:
    """Write ``tokens.npy`` and ``suite.json`` (both or neither) and load them back verified; a different
    suite already in ``out_dir`` is refused (stores captured for it would silently stop matching)."""
    import io

    existing = out_dir / SUITE_JSON
    if existing.exists():  # stores captured for that suite would silently stop matching it

        found = read_json(existing).get("manifest_sha256")
        if found != doc["manifest_sha256"]:
            raise VerificationError(existing, "existing suite (a suite is never overwritten by another)", doc["manifest_sha256"], found,
                                    "build into a new --out folder")
    buf = io.BytesIO()
    np.save(buf, tokens, allow_pickle=False)
    atomic_write_files({out_dir / TOKENS_FILE: buf.getvalue(), out_dir / SUITE_JSON: dumps_json(doc)})  # both or neither
    return load_suite(out_dir, verify=True)


def describe(suite: Suite, max_clusters: int = 20) -> str:
    """Human-readable summary: geometry, strata counts, the largest clusters, shards."""
    lines = [
        f"suite {suite.root}",
        f"  protocol {suite.protocol_version}, n_ctx {suite.n_ctx}, contexts {suite.n_contexts}, "
        f"scored positions {suite.n_contexts * (suite.n_ctx - 1)}",
        f"  tokenizer sha256 {suite.tokenizer_sha256} (vocab {suite.vocab_size})",
        f"  suite_token_sha256 {suite.suite_token_sha256}",
        "  strata:",
    ]
    for s, n in sorted(Counter(c.stratum for c in suite.contexts).items()):
        lines.append(f"    {s}: {n} contexts")
    clusters = Counter(c.source_cluster for c in suite.contexts)
    lines.append(f"  source clusters: {len(clusters)} (largest {min(max_clusters, len(clusters))} shown)")
    for cl, n in sorted(clusters.items(), key=lambda kv: (-kv[1], kv[0]))[:max_clusters]:
        lines.append(f"    {cl}: {n}")
    if len(clusters) > max_clusters:
        lines.append(f"    ... {len(clusters) - max_clusters} more")
    lines.append(f"  shards: {suite.n_shards}")
    for sh in suite.shards:
        lines.append(f"    {sh.index}: contexts [{sh.start}, {sh.stop}) sha256 {sh.sha256}")
    return "\n".join(lines)
