"""Tests of the fixture candidates and ``harness.engines.quantized``.

The expected weights are re-derived here independently, in numpy float64, from
the bf16 source weights and the recipe formulas (fixtures/README.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file as load_pt
from safetensors.torch import save_file as save_pt

from harness.engines.quantization import is_quantized_checkpoint, quantization_identity
from harness.engines.quantized import load_quantized
from harness.errors import VerificationError
from harness.io.hashing import sha256_file

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODEL_DIR = FIXTURES / "model"
CAND_DIR = FIXTURES / "candidates"
CANDIDATES = ("int8", "int4_g32", "int4_g32_b", "nvfp4", "int4_g32_sr1", "int4_g32_sr2", "int3_g32")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def rne(x: np.ndarray, mbits: int, emin: int | None = None, maxval: float | None = None) -> np.ndarray:
    """Round float64 to nearest-even with ``mbits`` mantissa bits (subnormals below ``emin``, saturating)."""
    x = np.asarray(x, dtype=np.float64)
    if maxval is not None:
        x = np.clip(x, -maxval, maxval)
    _, e = np.frexp(x)
    e = e.astype(np.float64) - 1
    if emin is not None:
        e = np.maximum(e, emin)
    step = np.exp2(e - mbits)
    return np.where(x == 0, x, np.round(x / step) * step)


def expected_weight(name: str, w: np.ndarray, stored: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """Independent float64 re-quantization + dequantization of one ``[out, in]`` weight."""
    out_f, in_f = w.shape
    if name in ("int8", "int4_g32", "int3_g32"):
        bits = {"int8": 8, "int4_g32": 4, "int3_g32": 3}[name]
        group = in_f if name == "int8" else 32
        qmax = 2 ** (bits - 1) - 1
        g = w.reshape(out_f, in_f // group, group)
        s = rne(np.abs(g).max(-1, keepdims=True) / qmax, 7)
        q = np.clip(np.round(g / np.where(s == 0, 1, s)), -qmax - 1, qmax)
        return (q * s).reshape(w.shape)
    if name == "nvfp4":
        gs = rne(np.abs(w).max() / (6.0 * 448.0), 7)
        g = w.reshape(out_f, in_f // 16, 16)
        bs = rne(np.abs(g).max(-1, keepdims=True) / 6.0 / gs, 3, -6, 448.0)
        step = bs * gs
        return (rne(g / np.where(step == 0, 1, step), 1, 0, 6.0) * step).reshape(w.shape)
    if name.startswith("int4_g32_sr"):
        # stochastic rounding: the absmax scale as for RTN; each code is the floor or the ceiling
        # of w / scale (the random draw picks which), so check that bracket and return its value.
        g = w.reshape(out_f, in_f // 32, 32)
        s = rne(np.abs(g).max(-1, keepdims=True) / 7, 7)
        x = g / np.where(s == 0, 1, s)
        got = stored[prefix + ".deq"].reshape(g.shape)
        lo = rne(np.clip(np.floor(x), -8, 7) * s, 7)
        hi = rne(np.clip(np.ceil(x), -8, 7) * s, 7)
        assert np.all((got == lo) | (got == hi)), f"{prefix}: a code is neither floor nor ceil of w / scale"
        return got.reshape(w.shape)
    # int4_g32_b: HQQ chooses scale/zero; the codes must be their round-to-nearest.
    s = stored[prefix + ".scales"].astype(np.float64)
    z = stored[prefix + ".zeros"].astype(np.float64)
    assert np.array_equal(rne(s, 7), s) and np.array_equal(rne(z, 7), z), "scale/zero not bf16"
    g = w.reshape(out_f, in_f // 32, 32)
    q = np.clip(np.round(g / s[..., None] + z[..., None]), 0, 15)
    return ((q - z[..., None]) * s[..., None]).reshape(w.shape)


def _bf16_as_f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


@pytest.fixture(scope="module")
def source() -> dict[str, np.ndarray]:
    """Source bf16 weights as float64 (exact; numpy has no bf16)."""
    return {k: _bf16_as_f64(v) for k, v in load_pt(str(MODEL_DIR / "model.safetensors")).items()}


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    """Every candidate, loaded once."""
    return {name: load_quantized(CAND_DIR / name) for name in CANDIDATES}


@pytest.mark.parametrize("name", CANDIDATES)
def test_dequantized_weights_match_formula(name: str, source, models) -> None:
    stored = {k: _bf16_as_f64(v) for k, v in load_pt(str(CAND_DIR / name / "model.safetensors")).items()
              if k.endswith((".scales", ".zeros"))}
    state = models[name].state_dict()
    for key in state:
        if key.endswith(".weight") and key.removesuffix(".weight").rsplit(".", 1)[-1] in LINEARS:
            stored[key.removesuffix(".weight") + ".deq"] = _bf16_as_f64(state[key])
    n = 0
    for key, w in source.items():
        prefix = key.removesuffix(".weight")
        got = _bf16_as_f64(state[key])
        if prefix.rsplit(".", 1)[-1] in LINEARS:
            want = rne(expected_weight(name, w, stored, prefix), 7)
            assert np.array_equal(got, want), f"{name} {key}: {np.sum(got != want)} weights differ"
            assert not np.array_equal(got, w), f"{name} {key} is not quantized"
            n += 1
        else:
            assert np.array_equal(got, w), f"{name} {key} should be bf16 unchanged"
    assert n == 28
    head = models[name].get_output_embeddings().weight
    assert torch.equal(head, models[name].get_input_embeddings().weight), "tied head must be the bf16 embedding"
    assert next(models[name].parameters()).dtype == torch.bfloat16
    assert not models[name].training


@pytest.mark.parametrize("name", CANDIDATES)
def test_identity_fields(name: str) -> None:
    d = CAND_DIR / name
    assert is_quantized_checkpoint(d)
    ident = quantization_identity(d)
    q = json.loads((d / "quantization.json").read_text())
    for key in ("method", "bits", "group_size", "library", "simulated"):
        assert ident[key] == q[key]
    assert ident["simulated"] is (name == "nvfp4")
    assert ident["source_model_sha256"] == sha256_file(MODEL_DIR / "model.safetensors")
    assert set(ident["files"]) == {"config.json", "quantization.json", "model.safetensors"}
    if name.startswith("int4_g32_sr"):
        assert ident["seed"] == int(name[-1]), "the seed is part of a stochastic recipe's identity"
    assert ident["files"]["model.safetensors"] == sha256_file(d / "model.safetensors")
    assert q["on_disk_bytes"] == (d / "model.safetensors").stat().st_size + (d / "config.json").stat().st_size
    assert len(q["layers"]) == 28
    assert not (d / "tokenizer.json").exists()
    assert not is_quantized_checkpoint(MODEL_DIR)


def _copy(tmp_path: Path, name: str = "int4_g32") -> Path:
    dst = tmp_path / name
    shutil.copytree(CAND_DIR / name, dst)
    return dst


@pytest.mark.parametrize("missing", ["model.safetensors", "config.json", "quantization.json"])
def test_missing_file_refused(tmp_path: Path, missing: str) -> None:
    d = _copy(tmp_path)
    (d / missing).unlink()
    with pytest.raises(VerificationError, match=missing):
        load_quantized(d)


def test_truncated_file_refused(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[:-1000])
    with pytest.raises(VerificationError, match="model.safetensors"):
        load_quantized(d)


def _rewrite(d: Path, edit) -> None:
    tensors = load_pt(str(d / "model.safetensors"))
    edit(tensors)
    save_pt(tensors, str(d / "model.safetensors"))


def test_nonfinite_scale_refused(tmp_path: Path) -> None:
    d = _copy(tmp_path)

    def edit(t: dict) -> None:
        t["model.layers.1.mlp.up_proj.scales"][3, 1] = float("nan")

    _rewrite(d, edit)
    with pytest.raises(VerificationError, match=r"model\.safetensors.*up_proj\.scales"):
        load_quantized(d)


def test_nonfinite_fp8_block_scale_refused(tmp_path: Path) -> None:
    d = _copy(tmp_path, "nvfp4")

    def edit(t: dict) -> None:
        t["model.layers.0.self_attn.q_proj.scales"][0, 0] = 0x7F  # e4m3fn NaN

    _rewrite(d, edit)
    with pytest.raises(VerificationError, match="q_proj.scales"):
        load_quantized(d)


def test_shape_mismatch_refused(tmp_path: Path) -> None:
    d = _copy(tmp_path)

    def edit(t: dict) -> None:
        key = "model.layers.2.self_attn.k_proj.scales"
        t[key] = t[key][:, :-1].contiguous()

    _rewrite(d, edit)
    with pytest.raises(VerificationError, match=r"model\.safetensors.*k_proj\.scales shape"):
        load_quantized(d)


def test_missing_tensor_refused(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    _rewrite(d, lambda t: t.pop("model.layers.3.mlp.down_proj.qweight"))
    with pytest.raises(VerificationError, match="down_proj.qweight"):
        load_quantized(d)


def test_no_pickle_files_in_candidates() -> None:
    for p in CAND_DIR.rglob("*"):
        assert p.suffix not in (".bin", ".pt", ".pth", ".pkl"), p


@pytest.mark.slow
def test_kld_ordering(models) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    docs = [ln for ln in (FIXTURES / "corpus" / "heldout.txt").read_text().split("\n") if ln][:8]
    ids = [tok.encode((FIXTURES / "corpus" / d).read_text()[:4000]).ids[:256] for d in docs]
    x = torch.tensor([i for i in ids if len(i) == 256][:6])
    assert len(x) == 6
    ref = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        lp = torch.log_softmax(ref(input_ids=x).logits.double(), -1)
        kld = {}
        for name in ("int8", "int4_g32", "int3_g32"):
            lq = torch.log_softmax(models[name](input_ids=x).logits.double(), -1)
            kld[name] = float((lp.exp() * (lp - lq)).sum(-1).mean())
    assert 0 < kld["int8"] < kld["int4_g32"] < kld["int3_g32"], kld
