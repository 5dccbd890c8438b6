"""Domain checks for numbers read from reports (harness/io/domain.py): each refuses naming the file, the
field, the expected and the found value; values inside the domain pass unchanged."""

from __future__ import annotations

import math
from typing import Any

import pytest

from harness.errors import VerificationError
from harness.io import domain


@pytest.mark.parametrize(("check", "value", "pattern"), [
    (lambda v: domain.divergence("r.json", "mean_kld", v), -1e-6, r"r\.json: mean_kld: expected >= 0 .*found -1e-06"),
    (lambda v: domain.divergence("r.json", "mean_kld", v), float("nan"), r"expected a finite number, found nan"),
    (lambda v: domain.finite("r.json", "x", v), 1e308, r"expected a number within \+-1e\+15, found 1e\+308"),
    (lambda v: domain.finite("r.json", "x", v), 10 ** 400, r"overflow"),
    (lambda v: domain.finite("r.json", "x", v), "0.5", r"expected a number, found '0.5'"),
    (lambda v: domain.finite("r.json", "x", v), True, r"expected a number, found True"),
    (lambda v: domain.count("r.json", "positions_scored", v), -3, r"positions_scored: expected an integer >= 1, found -3"),
    (lambda v: domain.count("r.json", "positions_scored", v), 0, r"expected an integer >= 1, found 0"),
    (lambda v: domain.count("r.json", "positions_scored", v), 3.0, r"expected an integer, found 3\.0"),
    (lambda v: domain.fraction("r.json", "top1", v), 1.5, r"top1: expected a fraction within \[0, 1\], found 1\.5"),
    (lambda v: domain.at_most("r.json", "top1", v, 4, "the positions"), 5, r"top1: expected at most the positions \(4\), found 5"),
])
def test_out_of_domain_refused(check: Any, value: Any, pattern: str) -> None:
    with pytest.raises(VerificationError, match=pattern):
        check(value)


def test_in_domain_passes() -> None:
    assert domain.divergence("r", "k", -1e-12) == -1e-12  # rounding of an exact zero
    assert domain.divergence("r", "k", 0) == 0.0
    assert domain.count("r", "n", 7) == 7 and domain.count("r", "n", 0, minimum=0) == 0
    assert domain.fraction("r", "t", 1) == 1.0


def test_fsum_overflow_is_named() -> None:
    with pytest.raises(VerificationError, match=r"r\.json: sum: expected a sum within the float range, found overflow"):
        domain.fsum("r.json", "sum", [1.7e308, 1.7e308])
    assert domain.fsum("r", "s", [0.1] * 10) == math.fsum([0.1] * 10)


def test_rederived_headline() -> None:
    assert domain.rederived("r", "token_mean_kld", 0.1 + 1e-9, 0.1) == 0.1 + 1e-9
    with pytest.raises(VerificationError, match=r"r: token_mean_kld \(re-derived from its rows\): expected 0\.1, found 0\.01"):
        domain.rederived("r", "token_mean_kld", 0.01, 0.1)
