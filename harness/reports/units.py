"""How an on-disk size is written, the same in the ladder, the candidate pages and the KLD-versus-size
plot: GiB from 1 GiB up, MiB below (the plot's axis takes the unit of its largest candidate); bits per
weight (:mod:`harness.allocation.bits_per_weight`) as ``linear / all``."""

from __future__ import annotations

from collections.abc import Mapping

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


def bpw_text(b: object) -> str:
    """Bits per weight as ``"4.50 / 9.11"`` (quantized linear weights / whole checkpoint), ``"— / 16.00"`` when
    nothing is quantized, ``"—"`` when unknown. ``b``: a candidate's recorded ``bits_per_weight``
    (:class:`harness.allocation.bits_per_weight.BitsPerWeight`, read back from a report: checked here)."""
    if not b or not isinstance(b, Mapping):
        return "—"
    lin, total = b.get("linear_bpw"), b.get("total_bpw")
    if not isinstance(total, (int, float)):
        return "—"
    return f"{'—' if not isinstance(lin, (int, float)) else f'{lin:.2f}'} / {total:.2f}"
