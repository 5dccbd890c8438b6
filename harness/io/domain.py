"""Domain checks for numbers read from reports (this project's, published ones, foreign ones).

A reader calls these on every value it takes from a file before it computes anything with it: a KLD
or JSD below zero (beyond :data:`DIVERGENCE_TOLERANCE`), a count that is not a positive integer, a
top-1 count above the positions, a value that is not finite or beyond :data:`MAX_MAGNITUDE`, a sum
that overflows, or a headline that does not follow from its rows (:func:`rederived`) is refused with
a :class:`~harness.errors.VerificationError` naming the file, the field, the expected and the found
value. The rules and bounds are listed in docs/refuses.md ("Numbers read from reports").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.errors import VerificationError

#: How far below zero a KLD or JSD may read and still be zero: the rounding of a float64 sum of terms of
#: either sign (exact zero for identical distributions, ``-1e-12``-ish for a near-identical pair after
#: rounding). A more negative value is not rounding, it is a wrong number.
DIVERGENCE_TOLERANCE = 1e-9
#: The largest magnitude any value read from a report may have: real divergences (nats) lie below ~1e4 and
#: no run scores 1e15 positions, so a larger value is not a measurement; sums of values within it never overflow.
MAX_MAGNITUDE = 1e15
#: Relative gap within which a headline re-derived from its rows equals the stated one (summation order).
REDERIVE_TOLERANCE = 1e-6


def finite(path: str | Path, what: str, x: Any, bound: float = MAX_MAGNITUDE) -> float:
    """``x`` as a float: a JSON number (not a bool, not a string), finite, with ``|x| <= bound``."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise VerificationError(path, what, "a number", repr(x))
    try:
        v = float(x)
    except OverflowError:
        raise VerificationError(path, what, f"a finite number within +-{bound:g}", f"an integer of {len(str(x))} digits (overflow)") from None
    if not math.isfinite(v):
        raise VerificationError(path, what, "a finite number", x)
    if abs(v) > bound:
        raise VerificationError(path, what, f"a number within +-{bound:g}", x)
    return v


def divergence(path: str | Path, what: str, x: Any, bound: float = MAX_MAGNITUDE) -> float:
    """A KLD or JSD: finite, at most ``bound``, and ``>= -DIVERGENCE_TOLERANCE`` (a divergence is never negative)."""
    v = finite(path, what, x, bound)
    if v < -DIVERGENCE_TOLERANCE:
        raise VerificationError(path, what, f">= 0 (a divergence; rounding tolerance {DIVERGENCE_TOLERANCE:g})", x)
    return v


def count(path: str | Path, what: str, x: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """A count: a JSON integer (not a float, not a bool), ``minimum <= x`` (positive by default), at most ``maximum``."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise VerificationError(path, what, "an integer", repr(x))
    if x < minimum:
        raise VerificationError(path, what, f"an integer >= {minimum}", x)
    top = int(MAX_MAGNITUDE) if maximum is None else maximum
    if x > top:
        raise VerificationError(path, what, f"an integer <= {top}", x)
    return x


def fraction(path: str | Path, what: str, x: Any) -> float:
    """A share (top-1 agreement, a coverage): finite and within ``[0, 1]``."""
    v = finite(path, what, x)
    if not 0.0 <= v <= 1.0:
        raise VerificationError(path, what, "a fraction within [0, 1]", x)
    return v


def at_most(path: str | Path, what: str, x: int, limit: int, limit_what: str) -> int:
    """``x <= limit`` (a top-1 count within its positions, a tail count within the total)."""
    if x > limit:
        raise VerificationError(path, what, f"at most {limit_what} ({limit})", x)
    return x


def fsum(path: str | Path, what: str, values: Iterable[float]) -> float:
    """``math.fsum`` of ``values`` whose overflow (or a non-finite result) is a named error, never a raw exception."""
    try:
        s = math.fsum(values)
    except OverflowError:
        raise VerificationError(path, what, "a sum within the float range", "overflow") from None
    if not math.isfinite(s):
        raise VerificationError(path, what, "a finite sum", s)
    return s


def rederived(path: str | Path, what: str, stated: Any, derived: float, rel_tol: float = REDERIVE_TOLERANCE,
              abs_tol: float = 0.0, source: str = "its rows") -> float:
    """The ``stated`` headline equals the one ``derived`` from the file's own ``source`` (its rows) within
    ``rel_tol`` (or ``abs_tol``)."""
    s = finite(path, what, stated)
    gap = abs(s - derived)
    if gap > abs_tol and gap > rel_tol * max(abs(s), abs(derived)):
        raise VerificationError(path, f"{what} (re-derived from {source})", derived, stated)
    return s
