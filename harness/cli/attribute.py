"""``fidelity attribute``: which tensor groups cause a candidate's drift, and where to spend bits."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.attribution.render import write_attribution
from harness.attribution.run import attribute, request_from
from harness.cli.registry import Builder, SubParsers, formatter, positive_int
from harness.cli.vocabulary import add_quiet, open_out
from harness.interchange.suite_manifest import load_any_suite


def _attribute(a: argparse.Namespace) -> int:
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    folder = open_out(a, load_any_suite(a.suite, verify=False).suite_token_sha256)
    req = request_from(a.reference, a.candidate, a.suite, shards=a.shards, by=a.by, globs=tuple(a.glob or ()),
                       modes=a.modes, n_boot=a.n_boot, device=a.device, dtype=a.dtype, progress=not a.quiet)
    result = attribute(req)
    paths = folder.record(write_attribution(result, a.out))
    for g in result["groupings"]:
        top = g["groups"][0]
        ci = top.get("restore", {}).get("ci95")
        iv = "[not estimable]" if ci is None else f"[{ci[0]:.3e}, {ci[1]:.3e}]"
        print(f"by {g['rule']}: first {top['group']} ΔKLD {top['restore']['value']:.3e} {iv}" if "restore" in top
              else f"by {g['rule']}")
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def add_attribute(sub: SubParsers) -> None:
    p = sub.add_parser(
        "attribute", help="attribute a candidate's KLD to tensor groups (leave-one-in / leave-one-out ablation)",
        formatter_class=formatter,
        description=(
            "Load the candidate once, swap each tensor group's weights in place between the candidate's\n"
            "and the reference's, capture the LM-head input on the suite and score it against the reference.\n"
            "Per group: ΔKLD = KLD(candidate) - KLD(candidate with the group restored) with a paired\n"
            "cluster-bootstrap interval, KLD of the reference with only the group quantized, the group's\n"
            "share of the candidate's bytes, how far the effects add up to the whole, and the groups with\n"
            "the highest ΔKLD per MiB (where extra bits buy the most).\n\n"
            "Models: transformers folders, the project's simulated quantized format, compressed-tensors and\n"
            "torchao weight-only checkpoints (decompressed to each module's effective weight). They must share\n"
            "an architecture. Refused, in one line naming why: schemes that quantize activations, and other\n"
            "quant_methods (AutoRound, GPTQ, AWQ, ...): export those as compressed-tensors first.\n"
            "Intervals: the shard reports' studentized source-cluster bootstrap, common random numbers.\n\n"
            "examples:\n"
            "  fidelity attribute --reference fixtures/model --candidate fixtures/candidates/int3_g32 \\\n"
            "      --suite fixtures/suite --shards 0-1 --out attribution/int3_g32\n"
            "  fidelity attribute ... --by kind --glob 'model.layers.[01].*' --modes restore"
        ),
    )
    p.add_argument("--reference", required=True, type=Path, help="the BF16 reference model folder")
    p.add_argument("--candidate", required=True, type=Path, help="the candidate model folder (same architecture)")
    p.add_argument("--suite", required=True, type=Path, help="the suite folder")
    p.add_argument("--shards", default=None, help="shards to use, e.g. 0-1 (default: all)")
    p.add_argument("--by", default="layer,kind", help="groupings: layer, kind, expert (one group per routed expert of each layer, with its routing "
                        "frequency on the suite; mixtures of experts) or several (default layer,kind); '' for globs only")
    p.add_argument("--glob", action="append", metavar="PATTERN", help="a group of parameters by glob (repeatable)")
    p.add_argument("--modes", default="restore,only", help="restore (leave-one-in), only (leave-one-out) or both")
    p.add_argument("--n-boot", type=positive_int, default=10_000, help="bootstrap replicates (default 10000)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--dtype", default="float32", help="compute dtype (default float32; weights keep their values)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    add_quiet(p)
    p.add_argument("--out", required=True, type=Path, help="folder for attribution.json/.md/.png")
    p.set_defaults(func=_attribute)


COMMANDS: tuple[Builder, ...] = (add_attribute,)
