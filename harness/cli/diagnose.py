"""``fidelity precision-floor`` and ``fidelity layers``: diagnostics of the reference itself and of a candidate's layers."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.attribution.layers_render import write_layers
from harness.cli.registry import Builder, SubParsers, formatter, positive_int
from harness.cli.vocabulary import add_config, open_out
from harness.errors import FidelityError
from harness.inputs.config import load_config
from harness.interchange.suite_manifest import load_any_suite
from harness.run.precision_floor import precision_floor, write_precision_floor


def _precision_floor(a: argparse.Namespace) -> int:
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = load_config(a.config)
    if cfg.reference.model is None:
        raise FidelityError(f"{cfg.path}: [reference] model is needed for the precision floor (a forward of its weights)")
    folder = open_out(a, load_any_suite(cfg.suite, verify=False).suite_token_sha256, config=cfg.path)
    r = precision_floor(suite_path=cfg.suite, model_dir=cfg.reference.model, store_path=cfg.reference.store,
                        head_path=cfg.reference.head, shards=a.shards, dtype=a.dtype, n_boot=a.n_boot)
    paths = folder.record(write_precision_floor(r, a.out))
    k = r["kld"]
    ci = "not estimable" if k["ci95"] is None else f"[{k['ci95'][0]:.3e}, {k['ci95'][1]:.3e}]"
    print(f"precision floor ({r['compute']['dtype']}): mean KLD {k['mean']:.3e} {ci} over {r['n_positions']} positions")
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def add_precision_floor(sub: SubParsers) -> None:
    p = sub.add_parser(
        "precision-floor", help="the reference capture against a higher-precision forward of the same weights",
        formatter_class=formatter,
        description=(
            "Run the configured reference model's bf16 weights in float64 (or float32) compute on the suite and\n"
            "score KL(P_capture || P_high): how far the committed bf16 reference capture is from exact arithmetic\n"
            "on its own weights. The scale below which a candidate's KLD cannot be told from the reference's own\n"
            "rounding (not an amount to subtract: rounding noise changes with the weights).\n\n"
            "example:\n"
            "  fidelity precision-floor --config fidelity.toml --shards 0 --out fidelity-reports"
        ),
    )
    add_config(p, "fidelity.toml (reference model, store, head, suite; default: fidelity.toml)", default=Path("fidelity.toml"))
    p.add_argument("--shards", default=None, help="shards to use, e.g. 0-1 (default: all)")
    p.add_argument("--dtype", default="float64", choices=("float64", "float32"), help="compute dtype of the forward (default float64)")
    p.add_argument("--n-boot", type=positive_int, default=10_000, help="bootstrap replicates (default 10000)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--out", required=True, type=Path, help="folder for precision_floor.json/.md")
    p.set_defaults(func=_precision_floor)


def _layers(a: argparse.Namespace) -> int:
    import torch

    from harness.attribution.layers import layer_errors

    if a.threads:
        torch.set_num_threads(a.threads)
    folder = open_out(a, load_any_suite(a.suite, verify=False).suite_token_sha256)
    r = layer_errors(a.reference, a.candidate, a.suite, shards=a.shards, contexts=a.contexts, dtype=a.dtype, device=a.device)
    paths = folder.record(write_layers(r, a.out))
    worst = r["layers"][r["ranking"][0]]
    print(f"worst layer (teacher-forced): {worst['layer']} rel {worst['teacher_forced']['rel_frobenius']:.3e}; "
          f"{r['timing']['total_s']:.1f} s")
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def add_layers(sub: SubParsers) -> None:
    p = sub.add_parser(
        "layers", help="per-layer and per-module error of a candidate's hidden states (one pass)",
        formatter_class=formatter,
        description=(
            "Run reference and candidate on a few contexts and compare every decoder layer's output hidden\n"
            "state (teacher-forced: each candidate layer fed the reference's input; free-running: each model on\n"
            "its own) and every linear module's output (fed the reference's input): relative Frobenius error,\n"
            "cosine error and SQNR per layer and per module kind. Distances of hidden states in seconds; for the\n"
            "causal effect on KLD use `fidelity attribute`.\n\n"
            "example:\n"
            "  fidelity layers --reference fixtures/model --candidate fixtures/candidates/int3_g32 \\\n"
            "      --suite fixtures/suite --contexts 4 --out layers/int3_g32"
        ),
    )
    p.add_argument("--reference", required=True, type=Path, help="the BF16 reference model folder")
    p.add_argument("--candidate", required=True, type=Path, help="the candidate model folder (same architecture)")
    p.add_argument("--suite", required=True, type=Path, help="the suite folder")
    p.add_argument("--shards", default=None, help="shards to take the contexts from (default: all)")
    p.add_argument("--contexts", type=positive_int, default=4, help="contexts to run (the first of the shards; default 4)")
    p.add_argument("--dtype", default="float32", help="compute dtype (default float32; weights keep their values)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--out", required=True, type=Path, help="folder for layers.json/.md/.png")
    p.set_defaults(func=_layers)


COMMANDS: tuple[Builder, ...] = (add_precision_floor, add_layers)
