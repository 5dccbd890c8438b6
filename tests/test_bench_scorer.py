"""pytest-benchmark cases: the scorer, its floors, and one shard end to end (docs/performance.md).

Marked ``fidelity_benchmark`` (this project's own marker; other projects' ``benchmark``-marked
tests are not touched) and off by default: they run only when selected with
``-m fidelity_benchmark`` or with ``FIDELITY_BENCHMARKS=1``. Serial only (pytest-benchmark
disables timing under xdist). The side-by-side ratios are in ``fidelity bench``.

    pytest tests/test_bench_scorer.py -m fidelity_benchmark
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from harness.scoring.scorer import bare_gemms, score_hidden, score_two_pass

pytestmark = [
    pytest.mark.fidelity_benchmark,
    pytest.mark.skipif(
        "'fidelity_benchmark' not in (config.getoption('markexpr', '') or '') and os.environ.get('FIDELITY_BENCHMARKS') != '1'",
        reason="benchmarks run with -m fidelity_benchmark (or FIDELITY_BENCHMARKS=1)",
    ),
]

#: A Qwen-proportioned shape small enough for a CI CPU (hidden 2048; the vocab and N scaled down).
N, HIDDEN, VOCAB = 256, 2048, 16_384
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    head = (torch.randn(VOCAB, HIDDEN, generator=g) / HIDDEN**0.5 * 4).bfloat16()
    ref = torch.randn(N, HIDDEN, generator=g).bfloat16()
    cand = (ref.float() + 0.05 * torch.randn(N, HIDDEN, generator=g)).bfloat16()
    return ref, cand, head, torch.randint(0, VOCAB, (N,), generator=g)


def test_bench_score_hidden(benchmark, inputs) -> None:
    ref, cand, head, y = inputs
    s = benchmark(score_hidden, ref, cand, head, y, backend="torch")
    assert len(s) == N and np.isfinite(s.kld).all() and (s.kld > 0).all()


def test_bench_bare_gemms_scorer_path(benchmark, inputs) -> None:
    ref, cand, head, _ = inputs
    benchmark(bare_gemms, ref, cand, head)


def test_bench_bare_gemms_bf16_logits(benchmark, inputs) -> None:
    ref, cand, head, _ = inputs
    benchmark(bare_gemms, ref, cand, head, fp32_logits=False)


def test_bench_two_pass(benchmark, inputs) -> None:
    ref, cand, head, y = inputs
    k = benchmark(score_two_pass, ref, cand, head, y)
    assert k.shape == (N,)


def test_bench_one_shard_end_to_end(benchmark) -> None:
    """Shard 0 of the embedded default's int8 candidate: load both captures, score, summarize
    (10,000 bootstrap replicates). The candidate's capture is made once, outside the timing."""
    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession
    from harness.run.shard import score_shard
    from harness.run.shard_inputs import ShardInputs

    config = load_config(ROOT / "fidelity.toml")
    cand = next(c for c in config.candidates if c.name == "int8")
    session = FidelitySession(config=config, device="cpu")
    store = session.candidate_store(cand, 0)

    def run():  # type: ignore[no-untyped-def]
        return score_shard(ShardInputs(suite=session.suite, shard=0, reference=session.reference, candidate=store,
                                       head=session.head), candidate_name=cand.name, n_boot=config.n_boot)

    report = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    assert report.timing["scorer_backend"] == "torch" and report.timing["scorer_gemm"] in ("fp32", "onednn-bf16")
    assert report.metrics["kld"]["mean"] > 0
