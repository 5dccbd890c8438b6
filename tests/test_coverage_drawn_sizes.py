"""benchmarks/coverage_drawn_sizes.py: the exact corpus law its truth rests on, against draws of the sizes."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def drawn() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("coverage_drawn_sizes")
    finally:
        sys.path.remove(str(BENCH))


def test_size_pmf_is_the_law_of_the_drawn_sizes(drawn: ModuleType) -> None:
    k, p = drawn.size_pmf()
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    n = 1_000_000
    sizes = drawn.draw_sizes(np.random.default_rng(11), (n,))
    freq = np.bincount(sizes, minlength=int(k.max()) + 1)[1:] / n
    se = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(freq - p) < 5 * se + 1e-7), np.abs(freq - p) / se


@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0])
def test_corpus_truth_is_the_token_mean_of_many_drawn_documents(drawn: ModuleType, exponent: float) -> None:
    norm_e, rel = drawn.corpus_difficulty(exponent)
    sizes = drawn.draw_sizes(np.random.default_rng(12), (1_000_000,)).astype(np.float64)
    g = sizes**exponent
    assert norm_e == pytest.approx(g.mean(), rel=1e-2)
    # the token-weighted mean difficulty of a very large suite (Monte-Carlo, float64)
    assert rel == pytest.approx((g / norm_e * sizes).sum() / sizes.sum(), rel=1e-2)
    if exponent == 0.0:
        assert rel == 1.0

