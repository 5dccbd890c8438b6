"""Write this project's suite, reference, candidate captures and reports in the published layout.

The folder written (``harness.inputs.interchange_layout`` describes every file) is accepted by the
published tool itself: its ``replay`` runs with ``--suite suite/shard-NNNN --reference
reference/<folder>`` (each reference folder holds one shard and declares that view's digest), and
its ``kld_aggregate.py`` reads the reports. Nothing is written unless everything was read and
checked first, and the folder appears whole or not at all (a staged directory renamed into place).

Shard views name their token files ``tokens/...`` relative to the view, as the published views do;
readers resolve them against the parent suite (the published card has users link ``../tokens``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import FidelityError
from harness.inputs.interchange_layout import (
    CAPTURE_MANIFEST,
    CAPTURE_SCHEMA,
    CAPTURES_DIR,
    HEAD_FILE,
    HIDDEN_TENSOR,
    LADDER_PIN,
    REFERENCE_DIR,
    REPORTS_DIR,
    SUITE_DIR,
    SUITE_MANIFEST,
    SUITE_SCHEMA,
    hidden_filename,
    shard_view_name,
)
from harness.interchange.report_format import identity_block, published_report
from harness.interchange.suite_manifest import ids_digest, published_digest
from harness.io.atomic import staged_directory
from harness.io.hashing import sha256_bytes, sha256_file

if TYPE_CHECKING:
    from harness.capture.store import CaptureStore
    from harness.inputs.suite import Suite
    from harness.reports.shard import ShardReport


def _dump(obj: Any) -> str:
    """JSON as the published tool writes it (``json.dumps(obj, indent=2)``, insertion order kept)."""
    return json.dumps(obj, indent=2, allow_nan=False)


def token_file(index: int) -> str:
    """A context's token file, relative to the suite folder."""
    return f"tokens/context-{index:04d}.json"


def suite_rows(suite: Suite) -> list[dict[str, Any]]:
    """The ``context_index`` rows of ``suite``, each with its ``token_sha256``."""
    rows = []
    for c in suite.contexts:
        ids = [int(t) for t in suite.tokens[c.index]]
        rows.append({"index": c.index, "stratum": c.stratum, "file": token_file(c.index), "token_sha256": ids_digest(ids),
                     "tokens": len(ids), "source_cluster": str(c.source_cluster)})
    return rows


def suite_manifest(suite: Suite, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A suite manifest over ``rows`` (the parent, or a shard view's slice)."""
    strata = Counter(r["stratum"] for r in rows)
    n = suite.n_ctx
    return {"schema": SUITE_SCHEMA, "model": None, "trust_remote_code": False, "context_length": n,
            "scored_positions_per_context": n - 1, "contexts": len(rows), "total_scored_positions": len(rows) * (n - 1),
            "tokenizer_sha256": suite.tokenizer_sha256, "strata": dict(sorted(strata.items())),
            "context_index": list(rows), "suite_token_sha256": published_digest([r["token_sha256"] for r in rows])}


def capture_files(store: CaptureStore, indices: Sequence[int], view_digest: str) -> dict[str, bytes]:
    """One capture folder's files: ``hidden_NNNN.safetensors`` for ``indices`` and its manifest."""
    from safetensors.torch import save

    if store.kind != "hidden_states":
        raise FidelityError(f"{store.root}: a {store.kind} store cannot be written in the published layout (hidden states only)")
    out: dict[str, bytes] = {}
    records = []
    for i in indices:
        t = store.load(i)
        data = save({HIDDEN_TENSOR: t.contiguous()})
        out[hidden_filename(i)] = data
        records.append({"index": i, "sha256": sha256_bytes(data), "shape": list(t.shape)})
    ident = identity_block(store.identity)
    manifest = {"schema": CAPTURE_SCHEMA, "model": ident["model_path"], "quantization": None, "quantization_config": None,
                "kv_cache_dtype": None, "candidate_identity": ident, "suite_token_sha256": view_digest, "filter": "all",
                "context_length": store.suite.n_ctx, "expected_contexts": len(records),
                "expected_indices": list(indices), "contexts": len(records), "captures": records, "complete": True}
    out[CAPTURE_MANIFEST] = _dump(manifest).encode()
    return out


def head_shape(head: Path) -> tuple[int, int]:
    """``(vocab, hidden)`` of a single-tensor head file, from its safetensors header."""
    from safetensors import safe_open

    with safe_open(str(head), framework="pt") as fh:
        keys = list(fh.keys())
        if len(keys) != 1:
            raise FidelityError(f"{head}: expected a head file with one tensor, found {keys}")
        shape = fh.get_slice(keys[0]).get_shape()
    if len(shape) != 2:
        raise FidelityError(f"{head}: expected a 2-D head [vocab, hidden], found shape {shape}")
    return int(shape[0]), int(shape[1])


def write_published(out: Path, *, suite: Suite, reference: CaptureStore, head: Path, reference_shards: Sequence[int],
                    candidates: Mapping[str, CaptureStore] | None = None,
                    reports: Mapping[str, Sequence[ShardReport]] | None = None) -> Path:
    """Write the dataset folder ``out`` (must not exist); returns it.

    ``reference_shards``: the shards whose reference is written (``reference/hidden-bf16`` for the
    first, ``reference/hidden-bf16-shard-NNNN`` for the others); ``candidates``: capture stores
    written under ``captures/shard-NNNN/hidden-<name>`` for every reference shard they cover;
    ``reports``: shard reports per candidate, written as ``reports/fidelity/shard-NNNN/report-<name>.json``.
    """
    if out.exists():
        raise FidelityError(f"{out}: the published-layout output must be a new folder, found one that exists")
    for k in reference_shards:
        suite.shard(k)
        if reference.missing(suite.shard_indices(k)):
            raise FidelityError(f"{reference.root}: the reference lacks contexts of shard {k}: it cannot be written")
    rows = suite_rows(suite)
    view_digests = {k: published_digest([r["token_sha256"] for r in rows[s.start:s.stop]]) for k, s in enumerate(suite.shards)}
    head_sha = sha256_file(head)
    vocab, hidden = head_shape(head)
    with staged_directory(out) as tmp:

        def put(rel: str, data: bytes) -> None:
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)

        put(f"{SUITE_DIR}/{SUITE_MANIFEST}", _dump(suite_manifest(suite, rows)).encode())
        for r in rows:
            put(f"{SUITE_DIR}/{r['file']}", json.dumps([int(t) for t in suite.tokens[r["index"]]]).encode())
        for k, s in enumerate(suite.shards):
            put(f"{SUITE_DIR}/{shard_view_name(k)}/{SUITE_MANIFEST}", _dump(suite_manifest(suite, rows[s.start:s.stop])).encode())
        put(HEAD_FILE, head.read_bytes())
        pin = {"schema": "fidelity.ladder-pin/1", "head_sha256": head_sha, "shard_size": suite.shards[0].n_contexts,
               "shards": len(suite.shards), "suite_token_sha256": published_digest([r["token_sha256"] for r in rows]),
               "written_by": "fidelity interchange writer"}
        put(f"{SUITE_DIR}/{LADDER_PIN}", _dump(pin).encode())
        for n, k in enumerate(reference_shards):
            folder = "hidden-bf16" if n == 0 else f"hidden-bf16-{shard_view_name(k)}"
            for name, data in capture_files(reference, suite.shard_indices(k), view_digests[k]).items():
                put(f"{REFERENCE_DIR}/{folder}/{name}", data)
        for cname, store in (candidates or {}).items():
            for k in reference_shards:
                if store.missing(suite.shard_indices(k)):
                    continue
                for name, data in capture_files(store, suite.shard_indices(k), view_digests[k]).items():
                    put(f"{CAPTURES_DIR}/{shard_view_name(k)}/hidden-{cname}/{name}", data)
        for cname, reps in (reports or {}).items():
            for rep in reps:
                k = int(rep.comparability["shard"]["index"])
                doc = published_report(rep, suite=suite, view_digest=view_digests[k], head_sha256=head_sha,
                                       vocab_size=vocab, hidden_size=hidden)
                put(f"{REPORTS_DIR}/fidelity/{shard_view_name(k)}/report-{cname}.json", _dump(doc).encode())
    return out
