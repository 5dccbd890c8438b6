"""pytest-benchmark cases for the scorer on a small shape (docs/design.md, section 6).

Marked ``benchmark``: the fidelity plugin skips them unless ``--fidelity-benchmarks`` is given
(and under xdist). Without the plugin loaded they are skipped unless ``FIDELITY_BENCHMARKS=1``.
The side-by-side ratios live in ``benchmarks/bench_scorer.py``.

    pytest tests/test_bench_scorer.py --fidelity-benchmarks
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.scoring.scorer import bare_gemms, score_hidden, score_two_pass

pytestmark = [
    pytest.mark.benchmark,
    pytest.mark.skipif(
        "not (config.getoption('fidelity_benchmarks', False) or os.environ.get('FIDELITY_BENCHMARKS') == '1')",
        reason="benchmarks run with --fidelity-benchmarks (or FIDELITY_BENCHMARKS=1 without the plugin)",
    ),
]

N, HIDDEN, VOCAB = 256, 512, 16_384


@pytest.fixture(scope="module")
def inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    head = (torch.randn(VOCAB, HIDDEN, generator=g) / HIDDEN**0.5 * 4).bfloat16()
    ref = torch.randn(N, HIDDEN, generator=g).bfloat16()
    cand = (ref.float() + 0.05 * torch.randn(N, HIDDEN, generator=g)).bfloat16()
    return ref, cand, head, torch.randint(0, VOCAB, (N,), generator=g)


def test_bench_score_hidden(benchmark, inputs) -> None:
    ref, cand, head, y = inputs
    s = benchmark(score_hidden, ref, cand, head, y)
    assert len(s) == N and np.isfinite(s.kld).all()


def test_bench_bare_gemms(benchmark, inputs) -> None:
    ref, cand, head, _ = inputs
    benchmark(bare_gemms, ref, cand, head)


def test_bench_two_pass(benchmark, inputs) -> None:
    ref, cand, head, y = inputs
    k = benchmark(score_two_pass, ref, cand, head, y)
    assert k.shape == (N,)
