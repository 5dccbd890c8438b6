"""How numbers are printed in the Markdown reports (one rule for every table)."""

from __future__ import annotations


def fmt_g(x: float) -> str:
    """A KLD-like number for a table: ``0`` exactly, 4 significant digits in [1e-3, 1e5), else 3-digit scientific."""
    return "0" if x == 0 else (f"{x:.4g}" if 1e-3 <= abs(x) < 1e5 else f"{x:.3e}")


def fmt_opt(x: float | None) -> str:
    """:func:`fmt_g`, with an em dash for a missing value."""
    return "—" if x is None else fmt_g(float(x))
