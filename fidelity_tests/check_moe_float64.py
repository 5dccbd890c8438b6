"""The MoE ladder's float64 check, collected with ``pytest fidelity-moe.toml`` and, the same check, with
``pytest fidelity-hybrid.toml`` (``conftest.py`` adds this module to those configurations' runs; a plain
``pytest`` does not collect it).

One candidate x shard (``int4_g32``, shard 0) of the configuration in use: the KLD the harness scored
(bf16 hidden states x the shared bf16 head, fp32 logits) is recomputed here independently in numpy
float64 from the stored hidden states of both capture stores and the head's weights -- logits, log-softmax
and KL(p || q) per position, then the token mean -- and compared position by position.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow
CANDIDATE, SHARD = "int4_g32", 0


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_float64_recomputation_of_one_candidate_shard(fidelity_session) -> None:  # type: ignore[no-untyped-def]
    cand = next(c for c in fidelity_session.config.candidates if c.name == CANDIDATE)
    inputs = fidelity_session.shard_inputs(cand, SHARD)
    scored = fidelity_session.positions(cand, SHARD)
    head = inputs.head.weight.double().numpy()
    ours: list[np.ndarray] = []
    for index in inputs.suite.shard_indices(SHARD):
        lp = _log_softmax(inputs.reference.load(index).double().numpy() @ head.T)
        lq = _log_softmax(inputs.candidate.load(index).double().numpy() @ head.T)
        ours.append((np.exp(lp) * (lp - lq)).sum(axis=-1))
    kld = np.concatenate(ours)
    harness = np.asarray(scored.scores.kld, dtype=np.float64)
    order = np.lexsort((scored.row, scored.context_index))  # contexts in suite order, rows in order
    harness = harness[order]
    assert harness.shape == kld.shape and kld.size == 16 * 255
    assert (kld >= -1e-12).all()
    # fp32 logits from bf16 operands (exact products, fp32 sums) against float64: a few 1e-7 nats per position
    np.testing.assert_allclose(harness, kld, rtol=1e-3, atol=2e-6)
    assert abs(harness.mean() - kld.mean()) <= 1e-4 * kld.mean()
