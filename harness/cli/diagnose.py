"""``fidelity precision-floor``: diagnostics of the reference itself and of a candidate's layers."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.registry import Builder, SubParsers, formatter, positive_int


def _precision_floor(a: argparse.Namespace) -> int:
    import torch

    from harness.errors import FidelityError
    from harness.inputs.config import load_config
    from harness.run.precision_floor import precision_floor, write_precision_floor

    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = load_config(a.config)
    if cfg.reference.model is None:
        raise FidelityError(f"{cfg.path}: [reference] model is needed for the precision floor (a forward of its weights)")
    r = precision_floor(suite_path=cfg.suite, model_dir=cfg.reference.model, store_path=cfg.reference.store,
                        head_path=cfg.reference.head, shards=a.shards, dtype=a.dtype, n_boot=a.n_boot)
    paths = write_precision_floor(r, a.out)
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
    p.add_argument("--config", type=Path, default=Path("fidelity.toml"), help="fidelity.toml (reference model, store, head, suite)")
    p.add_argument("--shards", default=None, help="shards to use, e.g. 0-1 (default: all)")
    p.add_argument("--dtype", default="float64", choices=("float64", "float32"), help="compute dtype of the forward (default float64)")
    p.add_argument("--n-boot", type=positive_int, default=10_000, help="bootstrap replicates (default 10000)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--out", required=True, type=Path, help="folder for precision_floor.json/.md")
    p.set_defaults(func=_precision_floor)


COMMANDS: tuple[Builder, ...] = (add_precision_floor,)
