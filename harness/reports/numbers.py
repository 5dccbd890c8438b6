"""How numbers are printed in the Markdown reports (one rule for every table)."""

from __future__ import annotations

from collections.abc import Sequence


def fmt_g(x: float) -> str:
    """A KLD-like number for a table: ``0`` exactly, 4 significant digits in [1e-3, 1e5), else 3-digit scientific."""
    return "0" if x == 0 else (f"{x:.4g}" if 1e-3 <= abs(x) < 1e5 else f"{x:.3e}")


def fmt_opt(x: float | None) -> str:
    """:func:`fmt_g`, with an em dash for a missing value."""
    return "—" if x is None else fmt_g(float(x))


def fmt_value(x: object, digits: int = 4) -> str:
    """Any report value: an em dash for ``None``; a float as :func:`fmt_g` with ``digits`` significant digits;
    anything else (counts, names) as ``str``."""
    if x is None:
        return "—"
    if isinstance(x, float):
        if x == 0.0:
            return "0"
        return f"{x:.{digits}g}" if (abs(x) >= 1e-3 and abs(x) < 1e5) else f"{x:.{digits - 1}e}"
    return str(x)


def fmt_interval(ci: Sequence[object] | None) -> str:
    """``[lo, hi]``; a ``null`` interval (fewer source clusters than the bootstrap's minimum) is not estimable."""
    return f"[{fmt_value(ci[0])}, {fmt_value(ci[1])}]" if ci else "not estimable"
