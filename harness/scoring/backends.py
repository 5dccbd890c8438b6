"""GPU kernels for the scorer (optional: need ``triton``; see :mod:`harness.scoring.fused_kl`)."""

from __future__ import annotations

import argparse
import os
import re
from typing import TYPE_CHECKING

from harness.errors import MissingPackageError, UsageError

if TYPE_CHECKING:
    import torch

#: Environment variables that choose how positions are scored (another kernel, GEMM path or block size: other
#: rounding), bound into every hand-over of scored positions. Thread counts (``FIDELITY_THREADS``) are not: they
#: only reorder a reduction.
SCORING_ENV = ("FIDELITY_SCORER_BACKEND", "FIDELITY_GEMM", "FIDELITY_FUSED_BLOCKS", "TRITON_INTERPRET")


def device_argument(value: str) -> str:
    """argparse type of a scoring device option (``fidelity ladder --device``, pytest's ``--fidelity-device``):
    ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; anything else is a usage error naming what was found."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, found {value!r}")
    return value


def scoring_env() -> dict[str, str]:
    """The :data:`SCORING_ENV` variables set in this process, by name."""
    return {k: os.environ[k] for k in SCORING_ENV if k in os.environ}


def triton_available() -> bool:
    """Whether ``triton`` imports (the fused kernel can then run on CUDA, or on a CPU under
    ``TRITON_INTERPRET=1``)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install
        return False
    return True


def interpreting() -> bool:
    """Whether Triton runs in its CPU interpreter (``TRITON_INTERPRET=1``, read at triton import)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def choose_backend(backend: str | None, dev: torch.device) -> str:
    """``torch`` or ``triton`` for :func:`harness.scoring.scorer.score_hidden` (see its docstring)."""
    choice = (backend or os.environ.get("FIDELITY_SCORER_BACKEND") or "auto").lower()
    if choice not in ("auto", "torch", "triton"):
        raise UsageError(f"scorer backend: expected auto, torch or triton, found {choice!r}")
    if choice == "triton" and not triton_available():
        raise MissingPackageError.extra("triton", "gpu", needed_for="scorer backend 'triton'")
    if choice == "auto":
        if dev.type != "cuda":
            return "torch"
        return "triton" if triton_available() else "torch"
    return choice
