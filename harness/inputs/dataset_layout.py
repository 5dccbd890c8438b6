"""File names, schema and the seed-scale size projection of a dataset folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.errors import FidelityError
from harness.io.jsonio import read_json

SCHEMA = "fidelity.dataset/1"
MANIFEST = "dataset.json"
PARTS = ("suite", "shards", "reference", "head", "tokenizer", "corpus", "reports")

#: The seed scale the projection is made for: hidden size, tokens per context, contexts per shard.
SEED_HIDDEN = 5120
SEED_N_CTX = 2048
SEED_CONTEXTS_PER_SHARD = 512
#: The seed model's vocabulary (its head is [248320, 5120]).
SEED_VOCAB = 248_320


def part_bytes(root: Path) -> dict[str, int]:
    """Bytes on disk of every part folder (and of the top-level files, as ``other``)."""
    out = {p: sum(f.stat().st_size for f in (root / p).rglob("*") if f.is_file()) for p in PARTS}
    out["other"] = sum(f.stat().st_size for f in root.iterdir() if f.is_file())
    return out


def seed_projection(*, reference_shards: int, hidden: int, n_ctx: int, contexts_per_shard: int, head_vocab: int,
                    report_bytes_per_context: float, corpus_bytes_per_token: float) -> dict[str, int]:
    """Projected bytes at the seed scale for the same number of reference shards.

    reference: rows x hidden x 2 bytes (bf16) per context; head: 248,320 x 5120 x 2 bytes;
    tokens: 4 bytes per token (suite + shard views); reports scale with the contexts per shard
    (``report_bytes_per_context``: all reports' bytes per context of one shard), the corpus with the tokens.
    """
    del hidden, n_ctx, contexts_per_shard, head_vocab  # the projection is at the seed scale, not this one
    ctx = reference_shards * SEED_CONTEXTS_PER_SHARD
    return {
        "reference": ctx * (SEED_N_CTX - 1) * SEED_HIDDEN * 2,
        "head": SEED_VOCAB * SEED_HIDDEN * 2,
        "tokens": 2 * ctx * SEED_N_CTX * 4,
        "reports": int(report_bytes_per_context * SEED_CONTEXTS_PER_SHARD),
        "corpus": int(corpus_bytes_per_token * ctx * SEED_N_CTX),
    }


@dataclass(frozen=True)
class DatasetInputs:
    """What a dataset folder supplies to a run (``[dataset] path`` in ``fidelity.toml``)."""

    suite: Path
    reference: Path
    head: Path
    reference_name: str
    #: Shards whose reference the dataset holds (the only ones it can score).
    shards: tuple[int, ...]


def dataset_inputs(root: Path) -> DatasetInputs:
    """The suite, reference store, head, reference name and reference shards of the dataset at ``root``.

    Reads ``dataset.json`` and checks that the parts exist; the contents are verified when a run first
    needs them (:func:`harness.dataset.verify.verify_dataset`). Raises :class:`FidelityError` naming the
    file, what was expected and what was found.
    """
    if not root.is_dir():
        raise FidelityError(f"{root}: expected a dataset folder (made by fidelity dataset build), "
                            f"found {'a file' if root.exists() else 'no such folder'}")
    mf = root / MANIFEST
    if not mf.is_file():
        raise FidelityError(f"{mf}: expected the dataset manifest of a fidelity dataset build folder, found no such file")
    doc = read_json(mf)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise FidelityError(f"{mf}: schema: expected {SCHEMA!r}, found {doc.get('schema') if isinstance(doc, dict) else doc!r}")
    ref = doc.get("reference")
    shards = ref.get("shards") if isinstance(ref, dict) else None
    name = ref.get("name") if isinstance(ref, dict) else None
    if not (isinstance(shards, list) and shards and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0
                                                        for k in shards)):
        raise FidelityError(f"{mf}: reference.shards: expected a non-empty list of shard numbers, found {shards!r}")
    if not isinstance(name, str) or not name:
        raise FidelityError(f"{mf}: reference.name: expected a non-empty string, found {name!r}")
    parts = DatasetInputs(suite=root / "suite", reference=root / "reference", head=root / "head" / "lm_head.safetensors",
                          reference_name=name, shards=tuple(shards))
    for need in (parts.suite / "suite.json", parts.reference / "capture.json", parts.head):
        if not need.is_file():
            raise FidelityError(f"{need}: expected this part of the dataset, found no such file")
    return parts
