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



def test_size_trend_is_a_z_of_the_halves_log_ratio(drawn: ModuleType) -> None:
    """Against the halves computed one cluster at a time (float64), and as a test statistic: with difficulty
    independent of size it exceeds 2 on about 2.3 % of large suites (the normal tail it is read against), with
    difficulty growing as size^0.5 on nearly all."""
    rng = np.random.default_rng(13)
    counts = rng.integers(1, 12, size=40).astype(np.float64)
    sums = counts * rng.lognormal(0.0, 0.4, size=40)
    med = float(np.median(counts))
    halves = []
    for keep in (lambda n: n > med, lambda n: n <= med):
        idx = [c for c in range(40) if keep(counts[c])]
        r = sum(sums[c] for c in idx) / sum(counts[c] for c in idx)
        var = len(idx) / (len(idx) - 1) * sum((sums[c] - r * counts[c]) ** 2 for c in idx) / sum(counts[c] for c in idx) ** 2
        halves.append((r, var))
    (rb, vb), (rs, vs) = halves
    assert drawn.size_trend(sums, counts) == pytest.approx(np.log(rb / rs) / np.sqrt(vb / rb**2 + vs / rs**2), rel=1e-12)
    assert drawn.size_trend(sums, np.full(40, 5.0)) == 0.0  # equal sizes: nothing to split

    def fires(exponent: float, reps: int = 4000, C: int = 300) -> float:
        n = rng.integers(1, 12, size=(reps, C)).astype(np.float64)
        s = n * n**exponent * rng.lognormal(0.0, 0.4, size=(reps, C))
        return float(np.mean([drawn.size_trend(s[i], n[i]) > drawn.TREND_Z for i in range(reps)]))

    null = fires(0.0)
    assert abs(null - 0.0228) < 4 * np.sqrt(0.0228 * 0.9772 / 4000), null
    assert fires(0.5, reps=200) > 0.95
