"""GPU kernels for the scorer (optional: need ``triton``; see :mod:`harness.kernels.fused_kl`)."""

from __future__ import annotations

import os


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
