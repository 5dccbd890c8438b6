"""``fidelity kld export|import|stats``: llama.cpp's ``.kld`` file and its statistics block."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from harness.capture.store import CaptureStore
from harness.cli.registry import Builder, SubParsers, formatter, positive_int
from harness.cli.vocabulary import add_out
from harness.inputs.head import load_head
from harness.inputs.suite import Suite
from harness.io.atomic import atomic_write_json
from harness.llamacpp.kld_file import read_kld
from harness.llamacpp.kld_tools import export_kld, import_kld, llamacpp_positions
from harness.llamacpp.stats import compute_stats, positions_from_scores, print_block
from harness.metrics import summarize
from harness.metrics.scores import PositionScores
from harness.run.shard_inputs import ShardInputs


def _export(a: argparse.Namespace) -> int:
    suite = Suite.load(a.suite, verify=True)
    store = CaptureStore.open(a.reference, suite, verify=True)
    head = None
    if a.head is not None:
        head = load_head(a.head)
    path = export_kld(suite, store, a.out, head=head)
    print(f"{path}: {suite.n_contexts} chunks x n_ctx {suite.n_ctx} ({path.stat().st_size} bytes); score a GGUF with:\n"
          f"  llama-perplexity -m CANDIDATE.gguf --kl-divergence --kl-divergence-base {path} -c {suite.n_ctx} -b {suite.n_ctx} -fa off -nr\n"
          "(-fa off -nr: no flash attention, no weight repacking -- the settings of the harness's llamacpp engine; "
          "llama.cpp's defaults change its logits)")
    return 0


def _import(a: argparse.Namespace) -> int:
    suite, store = import_kld(a.kld, a.out, n_shards=a.shards)
    first = suite.n_ctx // 2
    print(f"{suite.root}: suite ({suite.n_contexts} contexts x {suite.n_ctx}, {suite.n_shards} shard(s))\n"
          f"{store.root}: logits reference (rows {first}..{suite.n_ctx - 2} of each context; score with --window {first})")
    return 0


def _stats(a: argparse.Namespace) -> int:
    import numpy as np

    suite = Suite.load(a.suite, verify=True)
    kf = read_kld(a.kld)
    cand = CaptureStore.open(a.candidate, suite, verify=True)
    head = None
    if a.head is not None:
        head = load_head(a.head)
    approx = compute_stats(llamacpp_positions(kf, suite, cand, head))
    out: dict[str, object] = {"kld_file": str(a.kld), "llamacpp": approx}
    print(f"# llama.cpp statistics of {a.candidate} against {a.kld} (llama.cpp's formulas, uint16 base, entries > -16)")
    print(print_block(approx), end="")
    if a.reference is not None:
        from harness.run.shard import shard_positions

        ref = CaptureStore.open(a.reference, suite, verify=True)
        parts = [shard_positions(ShardInputs(suite=suite, shard=k, reference=ref, candidate=cand, head=head))
                 for k in range(suite.n_shards)]
        first = kf.first
        scores = PositionScores.concat([p.scores for p in parts])
        ctx = np.concatenate([p.context_index for p in parts])
        row = np.concatenate([p.row for p in parts])
        labels = [lab for p in parts for lab in p.labels]
        keep = row >= first
        exact = compute_stats(positions_from_scores(scores.select(keep)))
        m = summarize(scores, ctx, row, labels, score_from=first, n_boot=a.n_boot)
        lo, hi = m["kld"]["ci95"] or (math.nan, math.nan)  # nan: fewer clusters than an interval needs
        print(f"\n# exact (harness scorer, full vocabulary, fp32 logits) through the same formulas, rows >= {first}")
        print(print_block(exact), end="")
        print(f"\n# harness: mean KLD {m['kld']['mean']:.6f}, 95% studentized cluster-bootstrap CI [{lo:.6f}, {hi:.6f}] "
              f"({m['n_clusters']} clusters, {m['n_positions']} positions); llama.cpp's i.i.d. SE {approx['kld_mean'][1]:.6f}")
        out["exact"] = exact
        out["harness"] = {"kld_mean": m["kld"]["mean"], "ci95": m["kld"]["ci95"], "n_positions": m["n_positions"]}
    if a.out is not None:
        atomic_write_json(a.out, _not_estimable_as_null(out))
    return 0


def _not_estimable_as_null(obj: object) -> object:
    """The statistics as JSON data: numpy scalars as numbers, a value that is not estimable (NaN: e.g. a
    standard error of one position) or infinite as ``null`` -- a JSON file never holds NaN or Infinity."""
    if isinstance(obj, dict):
        return {str(k): _not_estimable_as_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_not_estimable_as_null(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # a numpy scalar
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def add_kld(sub: SubParsers) -> None:
    p = sub.add_parser("kld", help="llama.cpp .kld files: export our reference, import one, print llama.cpp's block",
                       formatter_class=formatter)
    ss = p.add_subparsers(dest="kld_cmd", required=True, metavar="{export,import,stats}")
    e = ss.add_parser("export", help="write a reference capture as a llama.cpp --kl-divergence-base file",
                      formatter_class=formatter,
                      description="One chunk per suite context; rows n_ctx/2 .. n_ctx-2 quantized as llama.cpp does.\n\n"
                      "example:\n  fidelity kld export --suite fixtures/suite --reference fixtures/reference \\\n"
                      "      --head fixtures/lm_head.safetensors --out ref.kld")
    e.add_argument("--suite", required=True, type=Path)
    e.add_argument("--reference", required=True, type=Path, help="reference capture store (logits or hidden states)")
    e.add_argument("--head", type=Path, default=None, help="shared head (needed for a hidden-state store)")
    e.add_argument("--out", required=True, type=Path, help="output .kld file")
    e.set_defaults(func=_export)
    i = ss.add_parser("import", help="turn a .kld file into a suite + logits-mode reference store", formatter_class=formatter,
                      description="example:\n  fidelity kld import base.kld --out imported/ --shards 4")
    i.add_argument("kld", type=Path)
    i.add_argument("--out", required=True, type=Path, help="folder: suite/ and reference/ are written inside")
    i.add_argument("--shards", type=positive_int, default=1)
    i.set_defaults(func=_import)
    s = ss.add_parser("stats", help="llama-perplexity --kl-divergence's block for a candidate capture", formatter_class=formatter,
                      description="example:\n  fidelity kld stats --kld ref.kld --suite fixtures/suite --candidate stores/q8 \\\n"
                      "      --reference fixtures/reference --head fixtures/lm_head.safetensors")
    s.add_argument("--kld", required=True, type=Path)
    s.add_argument("--suite", required=True, type=Path)
    s.add_argument("--candidate", required=True, type=Path, help="candidate capture store (logits, or hidden + --head)")
    s.add_argument("--reference", type=Path, default=None, help="reference store: also print the exact block and our bootstrap CI")
    s.add_argument("--head", type=Path, default=None)
    s.add_argument("--n-boot", dest="n_boot", type=positive_int, default=2000)
    add_out(s, "also write the numbers to this JSON file", required=False, old=("--json",))
    s.set_defaults(func=_stats)


#: Parser builders, in help order.
COMMANDS: tuple[Builder, ...] = (add_kld,)
