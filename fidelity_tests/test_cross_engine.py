"""Cross-engine floor (``pytest -m fidelity_cross_engine``): the same weights through two engines.

The fixture model's unquantized bf16 weights run through transformers (the committed reference
capture: bf16 hidden states x the shared head, fp32 logits) and through llama.cpp
(``fixtures/gguf/fixture-bf16.gguf``, logits): their KLD is the *floor* -- what a GGUF candidate
scores without any quantization, from kernels and accumulation order alone. Each GGUF quant of
``fixtures/gguf/`` is scored the same way and shown with its KLD *net* of that floor
(``cross_engine.md`` / ``cross_engine.json`` in the report folder). Nothing is subtracted silently:
the net column is labelled as such and the floor is printed beside it.

Skips with a reason when ``llama_cpp`` is not importable or the GGUF fixtures are missing.
Shard 0 only (16 contexts x 255 positions), so the default ``pytest`` run stays quick.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.fidelity_cross_engine

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT / "fixtures" / "gguf"
QUANTS = ("q8_0", "q6_k", "q4_k_m", "q4_0")
SHARD = 0


@pytest.fixture(scope="module")
def cross_engine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, float]]:
    from harness.engines.llamacpp import INSTALL_HINT, available

    if not available():
        pytest.skip(f"llama_cpp is not importable (install: {INSTALL_HINT})")
    if not (GGUF / "fixture-bf16.gguf").is_file():
        pytest.skip(f"{GGUF}/fixture-bf16.gguf missing (make it with fixtures/make_gguf.py)")
    from harness.capture.store import CaptureStore
    from harness.engines.llamacpp import capture
    from harness.inputs.head import load_head
    from harness.inputs.suite import Suite
    from harness.run.session import shard_positions

    suite = Suite.load(ROOT / "fixtures" / "suite")
    ref = CaptureStore.open(ROOT / "fixtures" / "reference", suite)
    head = load_head(ROOT / "fixtures" / "lm_head.safetensors")
    tmp = tmp_path_factory.mktemp("cross_engine")
    out: dict[str, dict[str, float]] = {}
    for name in ("bf16", *QUANTS):
        g = GGUF / f"fixture-{name}.gguf"
        if not g.is_file():
            continue
        store = capture(g, suite, tmp / name, shards=[SHARD], progress=False, threads=2)
        s = shard_positions(suite=suite, shard=SHARD, reference=ref, candidate=store, head=head).scores
        out[name] = {"mean_kld": float(s.kld.mean()), "p99": float(_p99(s.kld)), "top1": float(s.top1.mean()),
                     "bytes": g.stat().st_size, "n_positions": len(s)}
    return out


def _p99(x: object) -> float:
    import numpy as np

    return float(np.quantile(np.asarray(x), 0.99))


def test_floor_is_small(cross_engine: dict[str, dict[str, float]], request: pytest.FixtureRequest) -> None:
    floor = cross_engine["bf16"]["mean_kld"]
    lines = ["# Cross-engine floor (transformers bf16 reference vs llama.cpp, same bf16 weights)", "",
             f"suite fixtures/suite, shard {SHARD}, {cross_engine['bf16']['n_positions']} positions; "
             f"floor = KLD(reference || llama.cpp bf16 GGUF) = {floor:.3e} nats", "",
             "| candidate | GGUF bytes | mean KLD | floor | net of floor | p99 KLD | top-1 |", "|---|---|---|---|---|---|---|"]
    for name, r in cross_engine.items():
        lines.append(f"| {name} | {r['bytes']} | {r['mean_kld']:.3e} | {floor:.3e} | {r['mean_kld'] - floor:+.3e} | "
                     f"{r['p99']:.3e} | {r['top1']:.4f} |")
    out = Path(request.config.getoption("fidelity_report_dir"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "cross_engine.md").write_text("\n".join(lines) + "\n", "utf-8")
    (out / "cross_engine.json").write_text(json.dumps({"shard": SHARD, "floor": floor, "candidates": cross_engine}, indent=2) + "\n")
    # same weights: the engines differ only in kernels / accumulation order
    assert floor < 1e-3
    assert cross_engine["bf16"]["top1"] > 0.97


def test_quants_rank_above_floor(cross_engine: dict[str, dict[str, float]]) -> None:
    floor = cross_engine["bf16"]["mean_kld"]
    present = [q for q in QUANTS if q in cross_engine]
    if not present:
        pytest.skip("no quantized GGUF fixtures")
    for q in present:
        assert cross_engine[q]["mean_kld"] > floor, f"{q} scores below the cross-engine floor"
    if "q8_0" in cross_engine and "q4_0" in cross_engine:
        assert cross_engine["q8_0"]["mean_kld"] < cross_engine["q4_0"]["mean_kld"]
