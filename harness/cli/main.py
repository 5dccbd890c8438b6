"""The ``fidelity`` command: the top-level parser and the entry point.

Subcommands live in the modules of ``harness/cli/`` that :func:`build_parser` lists; each lists its
parser builders in ``COMMANDS``. Heavy imports (torch, transformers) happen inside handlers, so
``fidelity --help`` is instant.

Exit codes follow the error's class (:attr:`harness.errors.FidelityError.exit_code`, docs/refuses.md): 0 success;
1 a verification failure (``VerificationError``) or an operating-system error; 2 a usage error (``UsageError``,
argparse's own) or any other ``FidelityError``; 3 a missing optional package (``MissingPackageError``). Expected errors print one line,
``fidelity: error: <message>``, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from harness import __version__
from harness.cli import allocate, attribute, bench, dataset, diagnose, init, inputs, kld, ladder, plan, reports
from harness.cli.registry import formatter
from harness.cli.vocabulary import resolve
from harness.errors import FidelityError
from harness.io.atomic import refuse_overwriting_inputs, removed_on_failure
from harness.scoring.threads import apply_threads, choose_threads

# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="fidelity",
        formatter_class=formatter,
        description=(
            "Exact full-vocabulary KL divergence of quantized LLMs against their BF16 original.\n\n"
            "typical flow:\n"
            "  fidelity init --reference ref/ --candidate mine=quant/ --corpus corpus/ --out project/\n"
            "  pytest project/fidelity.toml --fidelity-update-baselines   # measure, record the baselines\n"
            "  pytest project/fidelity.toml                               # the gated ladder\n"
            "the same steps one by one: suite build, export-head, capture, replay; without pytest: ladder"
        ),
        epilog=(
            "environment:\n"
            "  FIDELITY_THREADS=N   torch CPU threads (default: the free cores, i.e. the cores minus the\n"
            "                       one-minute load average, or the tasks runnable now where fewer: a job\n"
            "                       that just ended does not count; at least 1; all cores on an idle machine).\n"
            "                       A command's --threads wins; so does an explicit OMP_NUM_THREADS.\n"
            "  FIDELITY_GEMM=auto|mkl-bf16-f32|onednn-bf16|fp32   the scorer's logits GEMM on a CPU"
        ),
    )
    parser.add_argument("--version", action="version", version=f"fidelity {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (init, inputs, reports, bench, kld, attribute, allocate, diagnose, plan, dataset, ladder):
        for add in module.COMMANDS:
            add(sub)
    return parser


#: Arguments that name what a command writes; every other path argument is one of its inputs.
OUTPUT_ARGS = ("out", "json")


def _output_and_input_paths(args: argparse.Namespace) -> tuple[list[tuple[str, Path]], list[Path]]:
    """The command's output paths (with their argument) and its existing input paths, from the parsed arguments."""
    outputs: list[tuple[str, Path]] = []
    inputs: list[Path] = []
    for key, value in vars(args).items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            if not isinstance(v, Path):
                continue
            if key in OUTPUT_ARGS:
                outputs.append((key, v))
            elif v.exists():
                inputs.append(v)
    return outputs, inputs


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fidelity`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = resolve(args)  # the positional and option forms of --config / --reports (harness/cli/vocabulary.py)
    if problem is not None:
        parser.error(problem)
    # the command line a report folder's ledger records (harness/reports/report_folder.py)
    args.command_line = shlex.join(["fidelity", *(sys.argv[1:] if argv is None else argv)])
    try:
        # FIDELITY_THREADS, else the free cores (harness/scoring/threads.py); a long-running command says it
        args.thread_choice = apply_threads(choose_threads())

        outputs, inputs = _output_and_input_paths(args)
        # an output never lands over or inside one of the command's inputs (a dataset, a store, a suite)
        for key, out in outputs:
            refuse_overwriting_inputs([out], inputs, f"{args.command} --{key}")
        with removed_on_failure(*(out for _k, out in outputs)):  # a refused command leaves nothing it created
            return int(args.func(args))
    except FidelityError as e:  # the class sets the status: VerificationError 1, UsageError 2, MissingPackageError 3
        print(f"fidelity: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # e.g. `fidelity suite show S | head` (an OSError: caught before the next clause)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # disk full, read-only folder, permission denied: named, never a traceback
        print(f"fidelity: error: {e.filename or '<output>'}: cannot read or write: {type(e).__name__}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fidelity: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
