"""bf16 through fp32 kernels (harness/engines/bf16_path.py): each kernel's result is the bf16 rounding of the
exact (float64) result to one bf16 unit, as a native bf16 kernel's is; the path is chosen by the setting and the
CPU, recorded in the capture's engine identity, and a capture on it lies as close to a float64 forward of the same
bf16 weights as the native capture does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.engines import bf16_path as mod
from harness.engines.bf16_path import Fp32Kernels, bf16_path, widen_weights
from harness.errors import FidelityError


def _ulps(x: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|x - exact| in bf16 units at |exact| (spacing 2^(e-7)), floored at the tensor's RMS / 16."""
    e = exact.double()
    scale = torch.maximum(e.abs(), e.pow(2).mean().sqrt() / 16)
    return (x.double() - e).abs() / torch.exp2(torch.floor(torch.log2(scale)) - 7)


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


def test_choice_follows_the_setting_then_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert bf16_path("cpu", {"FIDELITY_BF16_PATH": "fp32"}) == "fp32"
    assert bf16_path("cpu", {"FIDELITY_BF16_PATH": "native"}) == "native"
    assert bf16_path("cuda:0", {}) == "native"
    monkeypatch.setattr(mod, "native_bf16", lambda: False)
    assert bf16_path("cpu", {}) == "fp32"
    monkeypatch.setattr(mod, "native_bf16", lambda: True)
    assert bf16_path("cpu", {"FIDELITY_BF16_PATH": "auto"}) == "native"
    with pytest.raises(FidelityError, match="FIDELITY_BF16_PATH: expected one of auto, native, fp32, found 'fast'"):
        bf16_path("cpu", {"FIDELITY_BF16_PATH": "fast"})


def test_native_needs_a_cpu_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mod, "cpu_bf16_flags", lambda: ())
    assert mod.native_bf16() is False


@pytest.mark.parametrize("held", [False, True])
def test_linear_is_the_bf16_rounding_of_the_exact_result(held: bool) -> None:
    x, w, b = _bf16(64, 512, seed=1), _bf16(96, 512, seed=2), _bf16(96, seed=3)
    layer = torch.nn.Linear(512, 96, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    kernels = Fp32Kernels(widen_weights(layer) if held else None)
    with kernels.mode, torch.no_grad():
        got = layer(x)
    exact = x.double() @ w.double().T + b.double()
    assert got.dtype == torch.bfloat16
    assert float(_ulps(got, exact).max()) <= 1.0  # fp32 accumulation error is far below a bf16 unit
    # it ran the fp32 GEMM over the widened values (bit for bit), not a bf16 kernel
    assert torch.equal(got, F.linear(x.float(), w.float(), b.float()).bfloat16())


def test_small_models_hold_widened_weights(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose widened weights fit the limit holds them (the faster lever on small models); over the limit
    each weight is widened per use; the rows are the same bit for bit."""
    import numpy as np

    from harness.engines.base import EngineOptions
    from harness.engines.transformers import ENGINE

    monkeypatch.setenv("FIDELITY_BF16_PATH", "fp32")
    tokens = list(np.random.default_rng(2).integers(0, 300, size=(2, 32)))
    rows = {}
    for limit in (mod.HOLD_WIDENED_BYTES, 0):
        monkeypatch.setattr(mod, "HOLD_WIDENED_BYTES", limit)
        loaded = ENGINE.load(tiny_model, 32, "hidden_states", EngineOptions(device="cpu"))
        assert loaded.kernels is not None and loaded.model is not None
        n2d = sum(1 for p in loaded.model.parameters() if p.ndim == 2)
        assert len(loaded.kernels.widened) == (n2d if limit else 0)
        rows[limit] = torch.stack(loaded.forward_batch(tokens, "hidden_states"))
    assert torch.equal(rows[0], rows[mod.HOLD_WIDENED_BYTES])


def test_matmul_and_attention_round_once() -> None:
    a, c = _bf16(4, 32, 64, seed=4), _bf16(4, 64, 48, seed=5)
    q, k, v = _bf16(1, 2, 16, 8, seed=6), _bf16(1, 2, 16, 8, seed=7), _bf16(1, 2, 16, 8, seed=8)
    with Fp32Kernels().mode:
        mm = a @ c
        bmm = torch.bmm(a, c)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    exact = a.double() @ c.double()
    assert mm.dtype == bmm.dtype == att.dtype == torch.bfloat16
    assert float(_ulps(mm, exact).max()) <= 1.0 and torch.equal(mm, bmm)
    s = (q.double() @ k.double().transpose(-1, -2)) / 8 ** 0.5
    s = s.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    assert float(_ulps(att, torch.softmax(s, -1) @ v.double()).max()) <= 1.0
    # fp32 tensors are left alone
    f = torch.randn(8, 8)
    with Fp32Kernels().mode:
        assert (f @ f).dtype == torch.float32


def test_capture_on_the_fp32_path(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's capture on each path: the fp32 path is named in its identity, and its rows are as close to a
    float64 forward of the same bf16 weights as the native rows are (the bf16 rounding, propagated)."""
    import numpy as np

    from harness.engines.base import EngineOptions
    from harness.engines.transformers import ENGINE, head_inputs

    tokens = np.random.default_rng(0).integers(0, 300, size=(2, 32))
    rows, idents = {}, {}
    for path in ("native", "fp32"):
        monkeypatch.setenv("FIDELITY_BF16_PATH", path)
        loaded = ENGINE.load(tiny_model, 32, "hidden_states", EngineOptions(device="cpu"))
        rows[path] = torch.stack(loaded.forward_batch(list(tokens), "hidden_states"))
        idents[path] = loaded.identity()
        model = loaded.model
    assert idents["fp32"].get("bf16_path") == "fp32" and "bf16_path" not in idents["native"]
    assert model is not None
    exact = head_inputs(model.double(), torch.as_tensor(tokens), stop=False)[:, :-1]
    _assert_as_close_as_native(rows["fp32"], rows["native"], exact)


def _assert_as_close_as_native(rows: torch.Tensor, native: torch.Tensor, exact: torch.Tensor) -> None:
    """``rows`` lie as close to the float64 forward ``exact`` as the native bf16 rows do: the bf16 rounding of
    each operation, propagated, and nothing else (a different computation would be far outside this)."""
    got, ref = _ulps(rows, exact), _ulps(native, exact)
    assert float(got.mean()) <= 1.5 * float(ref.mean()) + 0.5
    assert float(got.max()) <= 2 * float(ref.max()) + 2


#: An AVX2-only CPU's kernels on any x86 CPU: oneDNN, MKL and ATen held to AVX2 (read once, at start).
AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}

_CHILD = """
import json, sys, numpy as np, torch
from harness.engines.base import EngineOptions
from harness.engines.bf16_path import bf16_path
from harness.engines.transformers import ENGINE
loaded = ENGINE.load(__import__("pathlib").Path(sys.argv[1]), 32, "hidden_states", EngineOptions(device="cpu"))
tokens = np.load(sys.argv[2])
torch.save(torch.stack(loaded.forward_batch(list(tokens), "hidden_states")), sys.argv[3])
print(json.dumps({"path": bf16_path("cpu"), "identity": loaded.identity().get("bf16_path"),
                  "capability": str(torch.backends.cpu.get_cpu_capability())}))
"""


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"), reason="the AVX2 limits are x86's")
def test_an_avx2_only_cpu_takes_the_fp32_path(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the CPU's kernels held to AVX2 (no native bf16), ``auto`` takes the fp32 path, says so in the engine
    identity, and its stored rows are the native bf16 path's to the bf16 rounding (float64 check)."""
    import json
    import os
    import subprocess
    import sys

    import numpy as np

    from harness.engines.base import EngineOptions
    from harness.engines.transformers import ENGINE, head_inputs

    tokens = np.random.default_rng(1).integers(0, 300, size=(2, 32))
    np.save(tmp_path / "tokens.npy", tokens)
    env = {**os.environ, **AVX2_ONLY, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("FIDELITY_BF16_PATH", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(tiny_model), str(tmp_path / "tokens.npy"), str(tmp_path / "rows.pt")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    child = json.loads(out.stdout.strip().splitlines()[-1])
    assert child == {"path": "fp32", "identity": "fp32", "capability": "AVX2"}
    monkeypatch.setenv("FIDELITY_BF16_PATH", "native")  # the bf16 kernels, native or emulated
    loaded = ENGINE.load(tiny_model, 32, "hidden_states", EngineOptions(device="cpu"))
    native = torch.stack(loaded.forward_batch(list(tokens), "hidden_states"))
    assert loaded.model is not None
    exact = head_inputs(loaded.model.double(), torch.as_tensor(tokens), stop=False)[:, :-1]
    _assert_as_close_as_native(torch.load(tmp_path / "rows.pt"), native, exact)
