"""``fidelity dataset build``: package the inputs and results of a project into one dataset folder."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from harness import PROTOCOL_VERSION, __version__
from harness.capture.store import CaptureStore, context_filename
from harness.dataset.card import render_dataset_card
from harness.errors import FidelityError
from harness.inputs.config import load_config
from harness.inputs.dataset_layout import MANIFEST, SCHEMA, part_bytes, seed_projection
from harness.inputs.head import load_head, sidecar_path
from harness.inputs.provenance import verify_documents
from harness.inputs.suite import Suite
from harness.io.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from harness.io.hashing import sha256_file
from harness.reports.aggregate import not_measured_lines
from harness.reports.report_set import find_shard_reports, not_measured, write_checksums
from harness.reports.shard import ShardReport

PROTOCOL_TEXT = """\
# Protocol (version {protocol})

A number in this dataset is the exact full-vocabulary KL divergence KL(p || q), in nats, of a
candidate's next-token distribution q from the BF16 reference's p, at every scored position of a
fixed suite of token contexts. Both hidden states go through the one shared BF16 LM head in
`head/`, so the number measures the model body.

Two numbers are comparable only when all of these are equal (a report's `comparability` block
carries them; `fidelity replay --dataset` refuses any difference):

1. protocol version ({protocol});
2. the suite: `suite_token_sha256` {suite} and, per shard, the shard's sha256;
3. the scoring window `score_from` (rows `score_from .. n_ctx-2` of each context; this dataset's
   reports use {windows});
4. the reference (its capture's model identity by content) and the shared head (sha256 {head});
5. the scorer settings, and the engine and runtime identity recorded for each candidate.

Shards without a reference in `reference/` cannot be replayed from this dataset.
"""


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def build_dataset(*, config_path: Path, reports_dir: Path | None, corpus: Path, tokenizer: Path, reference_shards: str,
                  out: Path) -> dict[str, Any]:
    """Write the dataset folder ``out`` (new or empty); returns its manifest. ``reports_dir`` None: a
    reference-only dataset (no candidate reports), which candidates are scored against."""
    if out.exists() and any(out.iterdir()):
        raise FidelityError(f"{out}: output folder exists and is not empty (a dataset is written whole)")
    cfg = load_config(config_path)
    suite = Suite.load(cfg.suite, verify=True)
    shards = suite.parse_shards(reference_shards)
    ref = CaptureStore.open(cfg.reference.store, suite, verify=True)
    wanted = [i for k in shards for i in suite.shard_indices(k)]
    if ref.missing(wanted):
        raise FidelityError(f"{ref.root}: reference lacks context {ref.missing(wanted)[0]} of the chosen shards")
    head = load_head(cfg.reference.head)
    texts = verify_documents(suite, corpus)
    if sha256_file(tokenizer) != suite.tokenizer_sha256:
        raise FidelityError(f"{tokenizer}: not the suite's tokenizer (sha256 {suite.tokenizer_sha256})")
    reports = [] if reports_dir is None else [(p, ShardReport.load(p)) for p in find_shard_reports([reports_dir])]
    for p, r in reports:
        if r.comparability["suite_token_sha256"] != suite.suite_token_sha256:
            raise FidelityError(f"{p}: report of another suite")

    for name in ("suite.json", "tokens.npy"):
        _copy(suite.root / name, out / "suite" / name)
    for sh in suite.shards:
        buf = io.BytesIO()
        np.save(buf, suite.tokens[sh.start:sh.stop], allow_pickle=False)
        atomic_write_bytes(out / "shards" / f"shard-{sh.index:02d}.npy", buf.getvalue())
        atomic_write_json(out / "shards" / f"shard-{sh.index:02d}.json", {
            "index": sh.index, "start": sh.start, "stop": sh.stop, "sha256": sh.sha256,
            "contexts": [{"index": c.index, "document": c.document, "start_token": c.start_token,
                          "source_cluster": c.source_cluster, "stratum": c.stratum}
                         for c in suite.contexts[sh.start:sh.stop]]})
    manifest = dict(ref.manifest)
    manifest["files"] = {context_filename(i): {"index": i, "sha256": ref.hashes[i]} for i in wanted}
    for i in wanted:
        _copy(ref.root / ref.files[i], out / "reference" / context_filename(i))
    atomic_write_json(out / "reference" / "capture.json", manifest)
    _copy(head.path, out / "head" / "lm_head.safetensors")
    _copy(sidecar_path(head.path), out / "head" / "lm_head.json")
    _copy(tokenizer, out / "tokenizer" / "tokenizer.json")
    for rel, data in texts.items():
        atomic_write_bytes(out / "corpus" / rel, data)
    for lic in sorted(p for p in corpus.iterdir() if p.is_file() and p.name.lower().startswith(("license", "copying"))):
        _copy(lic, out / "corpus" / lic.name)
    cands: dict[str, list[int]] = {}
    for p, r in reports:
        k = int(r.comparability["shard"]["index"])
        _copy(p, out / "reports" / r.candidate / f"shard-{k:02d}.json")
        if p.with_suffix(".md").is_file():
            _copy(p.with_suffix(".md"), out / "reports" / r.candidate / f"shard-{k:02d}.md")
        cands.setdefault(r.candidate, []).append(k)
    windows = sorted({int(r.comparability["score_from"]) for _p, r in reports})
    atomic_write_text(out / "PROTOCOL.md", PROTOCOL_TEXT.format(protocol=PROTOCOL_VERSION, suite=suite.suite_token_sha256,
                                                                windows=", ".join(map(str, windows)) or "none", head=head.sha256))
    sizes = part_bytes(out)
    seed = seed_projection(reference_shards=len(shards), hidden=ref.width, n_ctx=suite.n_ctx,
                           contexts_per_shard=suite.shards[0].n_contexts, head_vocab=head.vocab_size,
                           report_bytes_per_context=sizes["reports"] / suite.shards[0].n_contexts,
                           corpus_bytes_per_token=sizes["corpus"] / max(1, suite.n_contexts * suite.n_ctx))
    doc = {
        "schema": SCHEMA, "protocol_version": PROTOCOL_VERSION, "harness_version": __version__,
        "suite_token_sha256": suite.suite_token_sha256, "n_ctx": suite.n_ctx, "n_shards": suite.n_shards,
        "reference": {"name": cfg.reference.name, "shards": shards, "model": ref.identity, "kind": ref.kind, "width": ref.width},
        "head_sha256": head.sha256, "tokenizer_sha256": suite.tokenizer_sha256,
        "score_from": windows, "candidates": {k: sorted(v) for k, v in sorted(cands.items())},
        # configured candidates without a report (failed, skipped or not run), as the reports' run recorded them
        "not_measured": [] if reports_dir is None else not_measured(reports_dir, cands, cfg),
        "bytes": sizes, "seed_scale_bytes": seed,
    }
    atomic_write_json(out / MANIFEST, doc)
    atomic_write_text(out / "README.md", render_card(doc, suite.n_contexts, suite.meta.get("documents") or {}))
    write_checksums(out)
    return doc


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def size_lines(doc: dict[str, Any]) -> list[str]:
    """One line per part, then the seed-scale projection."""
    lines = [f"  {k:<10} {_mib(v):>12}  ({v} bytes)" for k, v in doc["bytes"].items()]
    lines.append(f"  {'total':<10} {_mib(sum(doc['bytes'].values())):>12}")
    lines.append(f"projected at the seed scale (hidden 5120, 2,048-token contexts, 512 contexts per shard, "
                 f"{len(doc['reference']['shards'])} reference shard(s)):")
    lines += [f"  {k:<10} {_mib(v):>12}" for k, v in doc["seed_scale_bytes"].items()]
    lines.append(f"  {'total':<10} {_mib(sum(doc['seed_scale_bytes'].values())):>12}")
    return lines


def render_card(doc: dict[str, Any], n_contexts: int, documents: dict[str, Any]) -> str:
    """The dataset card (:mod:`harness.dataset.card`): metadata the Hub reads, then what the folder holds,
    sizes per part, how to verify, how to replay, and the documents' sources and licences."""
    shards = ",".join(map(str, doc["reference"]["shards"]))
    return render_dataset_card(doc, n_contexts, documents, [
        "# Fidelity reference dataset", "",
        f"The token suite ({n_contexts} contexts x {doc['n_ctx']} tokens, {doc['n_shards']} shards, suite_token_sha256 "
        f"`{doc['suite_token_sha256']}`), the BF16 reference hidden states of shard(s) {shards}, the shared LM head, "
        "the corpus texts with per-document sha256/source/licence (in `suite/suite.json` `documents`) and the "
        f"candidates' per-shard reports ({', '.join(doc['candidates']) or 'none'}). Protocol and comparability rules: `PROTOCOL.md`.", "",
        *((not_measured_lines(doc["not_measured"]) + [""]) if doc.get("not_measured") else []),
        "## Sizes", "", "```", *size_lines(doc), "```", "",
        "## Verify", "", "```sh", "fidelity verify .            # checksums, manifests, identities, report derivations",
        "sha256sum -c checksums.txt  # the checksums alone", "```", "",
        "## Replay your own candidate", "", "```sh",
        f"fidelity capture --model MY_MODEL --suite suite --shards {shards} --out my-capture",
        f"fidelity replay --suite suite --reference reference --head head/lm_head.safetensors --candidate my-capture --shards {shards} --out my-reports",
        "```", "",
        "or as pytest cases gated by baselines: a `my.toml` beside this folder with `[dataset]` `path = \"<this folder>\"` "
        "and one `[[candidates]]` entry (`name`, `model`), then `pytest my.toml`.", ""])
