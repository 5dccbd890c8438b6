"""How an on-disk size is written, the same in the ladder, the candidate pages and the KLD-versus-size
plot: GiB from 1 GiB up, MiB below (the plot's axis takes the unit of its largest candidate); bits per
weight (:mod:`harness.allocation.bits_per_weight`) as ``linear / all``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GIB = 2**30
MIB = 2**20


def size_text(n: int | None, digits: int = 2) -> str:
    """``n`` bytes as ``"1.77 MiB"`` / ``"14.96 GiB"``; ``"—"`` when unknown."""
    if not n:
        return "—"
    return f"{n / GIB:.{digits}f} GiB" if n >= GIB else f"{n / MIB:.{digits}f} MiB"


def axis_unit(max_bytes: float) -> tuple[float, str]:
    """Divisor and unit of a size axis whose largest value is ``max_bytes``."""
    return (GIB, "GiB") if max_bytes >= GIB else (MIB, "MiB")


def bpw_text(b: Mapping[str, Any] | None) -> str:
    """Bits per weight as ``"4.50 / 9.11"`` (quantized linear weights / whole checkpoint), ``"— / 16.00"`` when
    nothing is quantized, ``"—"`` when unknown."""
    if not b:
        return "—"
    lin = "—" if b.get("linear_bpw") is None else f"{b['linear_bpw']:.2f}"
    return f"{lin} / {b['total_bpw']:.2f}"
