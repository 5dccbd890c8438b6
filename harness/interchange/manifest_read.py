"""A published suite manifest (``qwen38-distribution-fidelity/1`` to ``/6``) read from the manifest alone.

Checked, each disagreement a :class:`~harness.errors.VerificationError` naming the file, the field, the
expected and the found value: the schema is a known version; ``contexts`` (and, without
``allow_shortfall``, ``contexts_requested``) equals the rows; each row's ``index`` is its position, its
``token_sha256`` 64 hex digits, its ``tokens`` the ``context_length``; ``scored_positions_per_context`` is
``context_length - 1`` and ``total_scored_positions`` their product; ``strata`` and ``source_clusters``
are the rows' counts; ``partitions`` the rows' ``partition`` and ``sentinel`` counts; ``cluster_partition``
lists each partition's clusters, with no cluster on two sides (a leak); ``suite_token_sha256`` is the
digest of the rows' ``token_sha256`` in order. What each field means: docs/qwen38-receipts.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import VerificationError
from harness.inputs.interchange_layout import HEX64_RE, SUITE_SCHEMAS
from harness.io import domain
from harness.io.hashing import sha256_bytes, sha256_file
from harness.io.jsonio import read_json

#: The partitions a row may name (``partition``); ``sentinel`` rows are a flagged subset.
PARTITIONS = ("analysis", "qualification")
#: What a run may be restricted to: every context, one partition, or the sentinel rows.
SELECTIONS = ("all", *PARTITIONS, "sentinel")


@dataclass(frozen=True)
class ManifestRow:
    """One context of the manifest: its ``index``, ``stratum``, ``source_cluster``, ``token_sha256``,
    ``partition`` (None before the partitioned versions) and ``sentinel`` flag."""

    index: int
    stratum: str
    source_cluster: str
    token_sha256: str
    partition: str | None
    sentinel: bool


@dataclass(frozen=True)
class SuiteManifest:
    """A checked manifest: ``path``, ``sha256`` (of the file's bytes), ``schema``, ``context_length``,
    ``rows`` in suite order, ``suite_token_sha256``, ``model_identity`` (tokenizer/config digests, or None)."""

    path: Path
    sha256: str
    schema: str
    context_length: int
    rows: tuple[ManifestRow, ...]
    suite_token_sha256: str
    model_identity: Mapping[str, Any] | None

    @property
    def scored_positions_per_context(self) -> int:
        """Positions scored per context with no window: every token but the first."""
        return self.context_length - 1

    def row(self, index: int) -> ManifestRow | None:
        """The row of context ``index`` (None when the suite has no such context)."""
        return self.rows[index] if 0 <= index < len(self.rows) else None

    def lineage_digest(self, indices: Iterable[int]) -> str:
        """The published digest of a view of these contexts: their ``token_sha256`` chained in suite order."""
        return sha256_bytes("".join(self.rows[i].token_sha256 for i in sorted(set(indices))).encode())

    def selected(self, selection: str) -> frozenset[int]:
        """The context indices of ``selection`` (one of :data:`SELECTIONS`); a partition the manifest does not
        record is refused naming it."""
        if selection == "all":
            return frozenset(r.index for r in self.rows)
        if selection not in SELECTIONS:
            raise VerificationError(self.path, "selection", f"one of {', '.join(SELECTIONS)}", selection)
        if any(r.partition is None for r in self.rows):
            raise VerificationError(self.path, f"partition of the rows (to select {selection!r})", "recorded on every row",
                                    f"missing ({self.schema} records no partitions)")
        if selection == "sentinel":
            return frozenset(r.index for r in self.rows if r.sentinel)
        return frozenset(r.index for r in self.rows if r.partition == selection)


def _version(path: Path, doc: Mapping[str, Any]) -> str:
    schema = doc.get("schema")
    if schema not in SUITE_SCHEMAS:
        raise VerificationError(path, "schema (a published suite manifest version)", " or ".join(SUITE_SCHEMAS), repr(schema))
    return str(schema)


def _row(path: Path, pos: int, raw: Any, n_ctx: int) -> ManifestRow:
    where = f"context_index[{pos}]"
    if not isinstance(raw, dict):
        raise VerificationError(path, where, "an object", type(raw).__name__)
    for key in ("index", "stratum", "source_cluster", "token_sha256"):
        if key not in raw:
            raise VerificationError(path, f"{where}.{key}", "present", "missing")
    if domain.count(path, f"{where}.index", raw["index"], minimum=0) != pos:
        raise VerificationError(path, f"{where}.index (its position in the suite)", pos, raw["index"])
    sha = raw["token_sha256"]
    if not isinstance(sha, str) or not HEX64_RE.match(sha):
        raise VerificationError(path, f"{where}.token_sha256", "64 lowercase hex digits", repr(sha))
    if "tokens" in raw and domain.count(path, f"{where}.tokens", raw["tokens"]) != n_ctx:
        raise VerificationError(path, f"{where}.tokens (the suite's context_length)", n_ctx, raw["tokens"])
    part = raw.get("partition")
    if part is not None and part not in PARTITIONS:
        raise VerificationError(path, f"{where}.partition", " or ".join(PARTITIONS), repr(part))
    sentinel = raw.get("sentinel", False)
    if not isinstance(sentinel, bool):
        raise VerificationError(path, f"{where}.sentinel", "true or false", repr(sentinel))
    return ManifestRow(index=pos, stratum=str(raw["stratum"]), source_cluster=str(raw["source_cluster"]),
                       token_sha256=sha, partition=part, sentinel=sentinel)


def _counts(path: Path, doc: Mapping[str, Any], rows: list[ManifestRow], n_ctx: int) -> None:
    n = len(rows)
    if domain.count(path, "contexts", doc.get("contexts")) != n:
        raise VerificationError(path, "contexts (the rows of context_index)", n, doc.get("contexts"))
    if doc.get("allow_shortfall") is False and doc.get("contexts_requested") != n:
        raise VerificationError(path, "contexts_requested (allow_shortfall is false)", n, doc.get("contexts_requested"))
    per = doc.get("scored_positions_per_context")
    if per is not None and per != n_ctx - 1:
        raise VerificationError(path, "scored_positions_per_context (context_length - 1)", n_ctx - 1, per)
    total = doc.get("total_scored_positions")
    if total is not None and total != n * (n_ctx - 1):
        raise VerificationError(path, "total_scored_positions (contexts x scored positions per context)", n * (n_ctx - 1), total)
    strata = doc.get("strata")
    if strata is not None and dict(strata) != dict(Counter(r.stratum for r in rows)):
        raise VerificationError(path, "strata (the rows' stratum counts)", dict(sorted(Counter(r.stratum for r in rows).items())),
                                strata)
    clusters = {r.source_cluster for r in rows}
    if doc.get("source_clusters") is not None and doc["source_clusters"] != len(clusters):
        raise VerificationError(path, "source_clusters (distinct source_cluster of the rows)", len(clusters), doc["source_clusters"])


def _partitions(path: Path, doc: Mapping[str, Any], rows: list[ManifestRow]) -> None:
    """``partitions`` and ``cluster_partition`` agree with the rows; no cluster on both sides."""
    declared = doc.get("partitions")
    if declared is None and doc.get("cluster_partition") is None:
        return
    missing = [r.index for r in rows if r.partition is None]
    if missing:
        raise VerificationError(path, f"context_index[{missing[0]}].partition (the manifest declares partitions)", "present", "missing")
    if declared is not None:
        found = {p: sum(1 for r in rows if r.partition == p) for p in PARTITIONS}
        found["sentinels"] = sum(1 for r in rows if r.sentinel)
        for key, n in found.items():
            if declared.get(key) != n:
                raise VerificationError(path, f"partitions.{key} (the rows' count)", n, declared.get(key))
    cp = doc.get("cluster_partition")
    if cp is None:
        return
    side = {p: {r.source_cluster for r in rows if r.partition == p} for p in PARTITIONS}
    leak = sorted(side["analysis"] & side["qualification"])
    if leak:
        raise VerificationError(path, "context_index partitions (a source cluster on one side only)", "no cluster in both",
                                f"{len(leak)} cluster(s) in both, e.g. {leak[:3]}", "a partition leak")
    if cp.get("overlap"):
        raise VerificationError(path, "cluster_partition.overlap", "[] (no cluster in both partitions)", cp["overlap"][:3],
                                "a partition leak")
    for p in PARTITIONS:
        listed = cp.get(p)
        if not isinstance(listed, list) or set(listed) != side[p]:
            extra = sorted(set(listed or []) - side[p])[:3]
            lacking = sorted(side[p] - set(listed or []))[:3]
            raise VerificationError(path, f"cluster_partition.{p} (the clusters of the rows in {p})",
                                    f"{len(side[p])} cluster(s)", f"{len(listed or [])} (listed but not in {p}: {extra}; "
                                    f"in {p} but not listed: {lacking})", "a partition leak" if extra else None)


def read_manifest(path: Path) -> SuiteManifest:
    """Read and check the manifest at ``path`` (module docstring); the token files are not needed."""
    doc = read_json(path, expect=dict)
    schema = _version(path, doc)
    n_ctx = domain.count(path, "context_length", doc.get("context_length"), minimum=2)
    raw = doc.get("context_index")
    if not isinstance(raw, list) or not raw:
        raise VerificationError(path, "context_index", "a non-empty list of contexts", type(raw).__name__)
    rows = [_row(path, pos, r, n_ctx) for pos, r in enumerate(raw)]
    _counts(path, doc, rows, n_ctx)
    _partitions(path, doc, rows)
    digest = sha256_bytes("".join(r.token_sha256 for r in rows).encode())
    if doc.get("suite_token_sha256") != digest:
        raise VerificationError(path, "suite_token_sha256 (sha256 of the rows' token_sha256, in order)", digest,
                                doc.get("suite_token_sha256"))
    ident = doc.get("model_identity")
    if ident is not None:
        for key in ("tokenizer_sha256", "config_sha256"):
            v = ident.get(key) if isinstance(ident, dict) else None
            if v is not None and not (isinstance(v, str) and HEX64_RE.match(v)):
                raise VerificationError(path, f"model_identity.{key}", "64 lowercase hex digits", repr(v))
    return SuiteManifest(path=path, sha256=sha256_file(path), schema=schema, context_length=n_ctx, rows=tuple(rows),
                         suite_token_sha256=digest, model_identity=ident if isinstance(ident, dict) else None)


def check_model_identity(m: SuiteManifest, where: str | Path, tokenizer_sha256: str | None = None,
                         config_sha256: str | None = None) -> None:
    """The manifest's ``model_identity`` digests equal the reference's (``where`` names it), each when both are known."""
    ident = m.model_identity or {}
    for key, have in (("tokenizer_sha256", tokenizer_sha256), ("config_sha256", config_sha256)):
        want = ident.get(key)
        if want is not None and have is not None and want != have:
            raise VerificationError(where, f"{key} (the suite manifest's model_identity, {m.path})", want, have,
                                    "the suite was tokenized for another model")
