"""File names, schema and the seed-scale size projection of a dataset folder."""

from __future__ import annotations

from pathlib import Path

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
