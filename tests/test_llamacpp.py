"""Engine ``llamacpp`` (GGUF through llama-cpp-python) and logits-vs-hidden-state scoring.

The engine tests skip with a reason when ``llama_cpp`` is not importable or the committed GGUF
fixtures are absent; the mixed-kind scoring test needs neither.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
GGUF_DIR = ROOT / "fixtures" / "gguf"


def _need_llamacpp() -> None:
    from harness.engines.llamacpp import INSTALL_HINT, available

    if not available():
        pytest.skip(f"llama_cpp is not importable (install: {INSTALL_HINT})")


def _matches(scores: object, kl: np.ndarray, agree: np.ndarray) -> None:
    """The harness's per-position scores against the by-hand float64 values: each position's KL within
    1e-3 relative + 5e-7 absolute and the mean within 1e-3 relative + 5e-8 absolute (the harness's fp32
    logits, in any summation order, round each log-probability by ~1e-7 of its size), top-1 within the
    positions whose top two logits tie to fp32 rounding (at most 2)."""
    got = np.asarray(scores.kld, dtype=np.float64)  # type: ignore[attr-defined]
    assert got.shape == kl.shape
    np.testing.assert_allclose(got, kl, rtol=1e-3, atol=5e-7)
    assert got.mean() == pytest.approx(kl.mean(), rel=1e-3, abs=5e-8)
    assert abs(int(np.sum(np.asarray(scores.top1))) - int(agree.sum())) <= 2  # type: ignore[attr-defined]


def _gguf(name: str) -> Path:
    p = GGUF_DIR / f"fixture-{name}.gguf"
    if not p.is_file():
        pytest.skip(f"{p} missing (make it with fixtures/make_gguf.py)")
    return p


def test_logits_candidate_against_hidden_reference(fidelity_project: Path, tmp_path: Path, store_kl64: Any) -> None:
    """A logits store (what llama.cpp gives) is scored against a hidden-state reference through the head."""
    from harness.capture.loop import capture
    from harness.capture.store import CaptureStore
    from harness.engines.base import EngineOptions
    from harness.inputs.head import load_head
    from harness.inputs.suite import Suite
    from harness.run.shard import shard_positions
    from harness.run.shard_inputs import ShardInputs

    root = fidelity_project
    suite = Suite.load(root / "suite")
    head = load_head(root / "lm_head.safetensors")
    ref = CaptureStore.open(root / "reference", suite)
    bad_h = capture("transformers", root / "models" / "bad", suite, tmp_path / "bad_h", shards=[0], progress=False)
    bad_l = capture("transformers", root / "models" / "bad", suite, tmp_path / "bad_l", shards=[0], progress=False, kind="logits", options=EngineOptions(dtype="float32"))
    self_l = capture("transformers", root / "models" / "reference", suite, tmp_path / "ref_l", shards=[0], progress=False, kind="logits", options=EngineOptions(dtype="float32"))
    ph = shard_positions(ShardInputs(suite=suite, shard=0, reference=ref, candidate=bad_h, head=head))
    pl = shard_positions(ShardInputs(suite=suite, shard=0, reference=ref, candidate=bad_l, head=head))
    ps = shard_positions(ShardInputs(suite=suite, shard=0, reference=ref, candidate=self_l, head=head))
    assert pl.mode == "logits (reference through head)" and pl.head_sha256 == head.sha256
    for store, pos in ((bad_h, ph), (bad_l, pl), (self_l, ps)):
        _matches(pos.scores, *store_kl64(ref, store, suite, head))


def test_engine_refuses_non_gguf(tmp_path: Path) -> None:
    from harness.engines.llamacpp import check_gguf
    from harness.errors import FidelityError

    (tmp_path / "x.gguf").write_bytes(b"NOPE" + b"\0" * 16)
    with pytest.raises(FidelityError, match="not a GGUF file"):
        check_gguf(tmp_path / "x.gguf")
    with pytest.raises(FidelityError, match="not found"):
        check_gguf(tmp_path / "missing.gguf")


@pytest.fixture(scope="module")
def fixture_suite() -> object:
    from harness.inputs.suite import Suite

    return Suite.load(ROOT / "fixtures" / "suite")


def test_capture_bf16_gguf_matches_reference(fixture_suite: object, tmp_path: Path, store_kl64: Any) -> None:
    """The fixture model's own bf16 weights through llama.cpp: KLD to the transformers reference is a
    small floor (different kernels, not different weights); the store is a verified logits store."""
    _need_llamacpp()
    from harness.capture.loop import capture
    from harness.capture.store import CaptureStore
    from harness.engines.base import EngineOptions
    from harness.inputs.head import load_head
    from harness.run.shard import shard_positions
    from harness.run.shard_inputs import ShardInputs

    suite = fixture_suite
    g = _gguf("bf16")
    store = capture("llamacpp", g, suite, tmp_path / "cap", shards=[0], progress=False, options=EngineOptions(threads=2))
    assert store.kind == "logits" and store.width == 4096 and store.dtype == "float32"
    assert store.identity["format"] == "gguf" and len(store.identity["sha256"]) == 64
    assert store.manifest["engine"]["name"] == "llamacpp"
    ref = CaptureStore.open(ROOT / "fixtures" / "reference", suite)
    head = load_head(ROOT / "fixtures" / "lm_head.safetensors")
    pos = shard_positions(ShardInputs(suite=suite, shard=0, reference=ref, candidate=store, head=head))
    _matches(pos.scores, *store_kl64(ref, store, suite, head))
    # the stored rows are llama.cpp's own logits: llama-cpp-python called directly (one context per batch from
    # an empty cache, as documented), row t = the prediction after token t; fp32 logits of a few units, so
    # 1e-3 absolute + 1e-4 relative allows any CPU backend's summation order (a bf16 or fp16 rounding of the
    # logits, 4e-3 / 5e-4 relative, does not pass)
    import llama_cpp

    n = suite.n_ctx
    llm = llama_cpp.Llama(model_path=str(g), n_ctx=n, n_batch=n, n_ubatch=n, logits_all=True, n_threads=2,
                          n_threads_batch=2, seed=0, verbose=False)
    for i in suite.shard_indices(0)[:2]:
        llm.reset()
        llm.eval([int(t) for t in suite.tokens[i]])
        own = np.asarray(llm.scores[: n - 1], dtype=np.float32)
        np.testing.assert_allclose(store.load(i).numpy(), own, rtol=1e-4, atol=1e-3,
                                   err_msg=f"context {i}: stored logits differ from llama.cpp's")
    # resumable: a second run captures nothing new and gives identical bytes
    before = json.loads((store.root / "capture.json").read_text())
    capture("llamacpp", g, suite, tmp_path / "cap", shards=[0], progress=False, options=EngineOptions(threads=2))
    assert json.loads((store.root / "capture.json").read_text()) == before


def test_capture_is_deterministic(fixture_suite: object) -> None:
    _need_llamacpp()
    from harness.engines.llamacpp import capture_logits, load_model

    suite = fixture_suite
    model, _ = load_model(_gguf("q4_0"), suite.n_ctx, threads=2)
    a = capture_logits(model, suite.tokens[1]).numpy()
    b = capture_logits(model, suite.tokens[1]).numpy()
    assert a.shape == (suite.n_ctx - 1, 4096) and np.isfinite(a).all()
    assert np.array_equal(a, b)


def test_session_uses_llamacpp_engine(fixture_suite: object, tmp_path: Path, store_kl64: Any) -> None:
    """``engine = "llamacpp"`` in fidelity.toml: the session captures the GGUF live into its cache."""
    _need_llamacpp()
    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession

    g = _gguf("q8_0")
    shutil.copy(g, tmp_path / g.name)
    (tmp_path / "fidelity.toml").write_text(f"""
[suite]
path = "{ROOT / 'fixtures' / 'suite'}"
[reference]
name = "bf16"
store = "{ROOT / 'fixtures' / 'reference'}"
head = "{ROOT / 'fixtures' / 'lm_head.safetensors'}"
[settings]
cache_dir = "cache"
n_boot = 200
[[candidates]]
name = "q8_0"
engine = "llamacpp"
model = "{g.name}"
""")
    cfg = load_config(tmp_path / "fidelity.toml")
    sess = FidelitySession(cfg)
    cand = cfg.candidate("q8_0")
    res = sess.score(cand, 0, n_boot=200)
    assert sess.live_store_path(cand).parent == tmp_path / "cache" / "captures"
    from harness.capture.store import CaptureStore
    from harness.inputs.head import load_head

    suite = fixture_suite
    kl, _ = store_kl64(CaptureStore.open(ROOT / "fixtures" / "reference", suite), CaptureStore.open(sess.live_store_path(cand), suite),
                  suite, load_head(ROOT / "fixtures" / "lm_head.safetensors"))
    assert res.headline.mean_kld == pytest.approx(kl.mean(), rel=1e-3)


def test_capture_hidden_states_through_shared_head(fixture_suite: object, tmp_path: Path, store_kl64: Any) -> None:
    """kind hidden_states: llama.cpp's per-token embeddings (no pooling) are the final norm's output;
    through the shared head they score like the logits capture of the same bf16 GGUF."""
    _need_llamacpp()
    from harness.capture.loop import capture
    from harness.capture.store import CaptureStore
    from harness.engines.base import EngineOptions
    from harness.inputs.head import load_head
    from harness.run.shard import shard_positions
    from harness.run.shard_inputs import ShardInputs

    suite = fixture_suite
    g = _gguf("bf16")
    hs = capture("llamacpp", g, suite, tmp_path / "h", shards=[0], progress=False, kind="hidden_states", options=EngineOptions(threads=2))
    lg = capture("llamacpp", g, suite, tmp_path / "l", shards=[0], progress=False, options=EngineOptions(threads=2))
    assert hs.kind == "hidden_states" and hs.width == 128 and hs.dtype == "bfloat16"
    ref = CaptureStore.open(ROOT / "fixtures" / "reference", suite)
    head = load_head(ROOT / "fixtures" / "lm_head.safetensors")
    ph = shard_positions(ShardInputs(suite=suite, shard=0, reference=ref, candidate=hs, head=head)).scores
    pl = shard_positions(ShardInputs(suite=suite, shard=0, reference=ref, candidate=lg, head=head)).scores
    _matches(ph, *store_kl64(ref, hs, suite, head))
    _matches(pl, *store_kl64(ref, lg, suite, head))


def test_cli_capture_engine_llamacpp(tmp_path: Path) -> None:
    _need_llamacpp()
    from harness.capture.store import CaptureStore
    from harness.cli.main import main
    from harness.inputs.suite import Suite

    g = _gguf("q4_0")
    assert main(["capture", "--engine", "llamacpp", "--model", str(g), "--suite", str(ROOT / "fixtures" / "suite"),
                 "--out", str(tmp_path / "s"), "--shards", "5", "--quiet", "--threads", "2"]) == 0
    st = CaptureStore.open(tmp_path / "s", Suite.load(ROOT / "fixtures" / "suite"))
    assert st.kind == "logits" and len(st.indices) == 16
    assert main(["capture", "--engine", "llamacpp", "--model", str(ROOT / "fixtures" / "model"),
                 "--suite", str(ROOT / "fixtures" / "suite"), "--out", str(tmp_path / "x"), "--quiet"]) == 2
