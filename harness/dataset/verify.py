"""``fidelity verify DATASET``: every check a stranger can run on a downloaded dataset; the first
disagreement is raised as a :class:`~harness.errors.VerificationError` naming the file.

Order: checksums.txt (changed, missing or extra files); dataset.json (schema, protocol); the suite
(manifest, token and shard hashes) and its hash in dataset.json; the shard views against the suite;
the reference store (every file content-verified, exactly the declared shards) and its model
identity; the head (sha256, sidecar) against dataset.json, the reference width and the model it was
exported from; the tokenizer and every corpus document against their sha256; every report (schema,
suite and shard hashes, head, reference identity, rows adding up to the report's own summary).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness import PROTOCOL_VERSION
from harness.capture.store import CaptureStore
from harness.errors import VerificationError
from harness.inputs.dataset_layout import MANIFEST, SCHEMA
from harness.inputs.head import load_head
from harness.inputs.provenance import verify_documents
from harness.inputs.suite import Suite
from harness.io.hashing import sha256_file, tokens_sha256
from harness.io.jsonio import read_json
from harness.io.schema import MapOf, check
from harness.reports.aggregate import check_rows_match_summary
from harness.reports.report_set import verify_set
from harness.reports.shard import ShardReport

#: What the rest of the verification and ``replay --dataset`` read from ``dataset.json`` (harness.io.schema).
MANIFEST_SCHEMA = {
    "schema": str, "protocol_version": int, "suite_token_sha256": str, "head_sha256": str,
    "reference": {"name": str, "shards": [int], "model": MapOf(object), "kind": str, "width": int},
    "score_from": [int], "candidates": MapOf([int]),
}


def _without_name(model: dict[str, Any]) -> dict[str, Any]:
    """A model identity by content only (the folder name is informative)."""
    return {k: v for k, v in model.items() if k != "name"}


def verify_dataset(root: Path) -> dict[str, Any]:
    """Verify a dataset folder; returns its manifest. Raises at the first disagreement."""
    problems = verify_set(root)
    if problems:
        raise VerificationError(root / "checksums.txt", "dataset files", "every file as listed", problems[0])

    mf = root / MANIFEST
    doc = read_json(mf)
    if doc.get("schema") != SCHEMA:
        raise VerificationError(mf, "schema", SCHEMA, doc.get("schema"))
    check(doc, MANIFEST_SCHEMA, mf)
    if doc.get("protocol_version") != PROTOCOL_VERSION:
        raise VerificationError(mf, "protocol_version", PROTOCOL_VERSION, doc.get("protocol_version"))
    suite = Suite.load(root / "suite", verify=True)
    if doc.get("suite_token_sha256") != suite.suite_token_sha256:
        raise VerificationError(mf, "suite_token_sha256 (suite/suite.json)", suite.suite_token_sha256, doc.get("suite_token_sha256"))
    for sh in suite.shards:
        view = root / "shards" / f"shard-{sh.index:02d}.npy"
        arr = np.load(view, allow_pickle=False)
        if tokens_sha256(arr) != sh.sha256 or not np.array_equal(arr, suite.tokens[sh.start:sh.stop]):
            raise VerificationError(view, f"shard {sh.index} token rows", sh.sha256, tokens_sha256(arr))
        meta = read_json(root / "shards" / f"shard-{sh.index:02d}.json")
        if (meta.get("start"), meta.get("stop"), meta.get("sha256")) != (sh.start, sh.stop, sh.sha256):
            raise VerificationError(view.with_suffix(".json"), "shard view", (sh.start, sh.stop, sh.sha256),
                                    (meta.get("start"), meta.get("stop"), meta.get("sha256")))
    ref = CaptureStore.open(root / "reference", suite, verify=True)
    shards = doc["reference"]["shards"]
    wanted = [i for k in shards for i in suite.shard_indices(k)]
    if ref.indices != wanted:
        raise VerificationError(root / "reference" / "capture.json", "contexts", f"those of shard(s) {shards}", ref.indices[:5])
    ref.verify_all()
    if ref.identity != doc["reference"]["model"]:
        raise VerificationError(mf, "reference.model (reference/capture.json)", ref.identity, doc["reference"]["model"])
    head = load_head(root / "head" / "lm_head.safetensors", expected_sha256=doc.get("head_sha256"))
    if head.hidden_size != ref.width:
        raise VerificationError(head.path, "hidden_size (the reference's width)", ref.width, head.hidden_size)
    src = read_json(root / "head" / "lm_head.json").get("source_model") or {}
    if not isinstance(src, dict):
        raise VerificationError(root / "head" / "lm_head.json", "source_model", "an object (the model's identity)", src)
    if _without_name(src) != _without_name(ref.identity):
        raise VerificationError(root / "head" / "lm_head.json", "source_model (the reference store's model)", _without_name(ref.identity), _without_name(src))
    tok = root / "tokenizer" / "tokenizer.json"
    if sha256_file(tok) != suite.tokenizer_sha256:
        raise VerificationError(tok, "sha256 (suite.json tokenizer.sha256)", suite.tokenizer_sha256, sha256_file(tok))
    verify_documents(suite, root / "corpus")
    for cand in doc["candidates"]:
        for k in doc["candidates"][cand]:
            p = root / "reports" / cand / f"shard-{k:02d}.json"
            r = ShardReport.load(p)
            comp = r.comparability
            checks = (("comparability.suite_token_sha256", suite.suite_token_sha256, comp["suite_token_sha256"]),
                      ("comparability.shard", {"index": k, "sha256": suite.shard(k).sha256}, comp["shard"]),
                      ("comparability.head_sha256", head.sha256, comp["head_sha256"]),
                      ("comparability.reference.identity", ref.identity, comp["reference"].get("identity")),
                      ("metrics.n_contexts", suite.shard(k).n_contexts, r.metrics["n_contexts"]))
            for what, want, found in checks:
                if want != found:
                    raise VerificationError(p, what, want, found)
            r.source = str(p)
            check_rows_match_summary(r)
    return dict(doc)
