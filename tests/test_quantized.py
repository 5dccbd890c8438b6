"""Tests of the fixture candidates and ``harness.engines.quant_weights``.

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

from harness.engines.quant_manifest import is_quantized_checkpoint, quantization_identity
from harness.engines.quant_weights import load_quantized
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
        # stochastic rounding: the absmax scale as for RTN, recomputed here; the codes are read from the
        # file's packed bytes by hand (two 4-bit codes per byte, high nibble first) and must each be the
        # floor or the ceiling of w / scale; the weight is (code - 8) * scale. Whether the floor/ceiling
        # choice is an unbiased random draw is checked over every weight by test_stochastic_rounding_is_unbiased.
        g = w.reshape(out_f, in_f // 32, 32)
        s = rne(np.abs(g).max(-1, keepdims=True) / 7, 7)
        assert np.array_equal(stored[prefix + ".scales"], s[..., 0]), f"{prefix}: scale is not bf16(absmax / 7)"
        q = nibbles(stored[prefix + ".qweight"]).reshape(g.shape) - 8.0
        x = g / np.where(s == 0, 1, s)
        assert np.all((q == np.clip(np.floor(x), -8, 7)) | (q == np.clip(np.ceil(x), -8, 7))), \
            f"{prefix}: a code is neither floor nor ceil of w / scale"
        return (q * s).reshape(w.shape)
    # int4_g32_b: HQQ chooses scale/zero; the codes must be their round-to-nearest.
    s = stored[prefix + ".scales"].astype(np.float64)
    z = stored[prefix + ".zeros"].astype(np.float64)
    assert np.array_equal(rne(s, 7), s) and np.array_equal(rne(z, 7), z), "scale/zero not bf16"
    g = w.reshape(out_f, in_f // 32, 32)
    q = np.clip(np.round(g / s[..., None] + z[..., None]), 0, 15)
    return ((q - z[..., None]) * s[..., None]).reshape(w.shape)


def nibbles(packed: np.ndarray) -> np.ndarray:
    """4-bit codes of packed bytes, high nibble first, as float64 (the file format, decoded by hand)."""
    b = np.asarray(packed, dtype=np.uint8).reshape(-1).astype(np.int64)
    return np.stack([b // 16, b % 16], axis=1).reshape(-1).astype(np.float64)


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
    raw = load_pt(str(CAND_DIR / name / "model.safetensors"))
    stored = {k: _bf16_as_f64(v) for k, v in raw.items() if k.endswith((".scales", ".zeros"))}
    stored.update({k: v.numpy() for k, v in raw.items() if k.endswith(".qweight")})
    state = models[name].state_dict()
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


def _sr_draws(cand: Path, source: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Over every quantized weight of a stochastic-rounding candidate whose ``x = w / scale`` is not an
    integer and lies inside the code range: the fractional part of ``x`` and whether the stored code
    (decoded by hand) is its ceiling."""
    raw = load_pt(str(cand / "model.safetensors"))
    fracs, ups = [], []
    for key, w in source.items():
        prefix = key.removesuffix(".weight")
        if prefix.rsplit(".", 1)[-1] not in LINEARS:
            continue
        out_f, in_f = w.shape
        g = w.reshape(out_f, in_f // 32, 32)
        s = _bf16_as_f64(raw[prefix + ".scales"])[..., None]
        x = (g / np.where(s == 0, 1, s)).reshape(-1)
        q = nibbles(raw[prefix + ".qweight"].numpy()) - 8.0
        keep = (x != np.floor(x)) & (x > -8) & (x < 7)
        fracs.append((x - np.floor(x))[keep])
        ups.append((q == np.ceil(x))[keep])
    return np.concatenate(fracs), np.concatenate(ups)


def check_stochastic_rounding(cand: Path, source: dict[str, np.ndarray]) -> np.ndarray:
    """Stochastic rounding rounds up with probability equal to the fractional part (unbiased), checked in
    ten bins of the fractional part (binomial: 4.5 standard errors + 0.002); returns the up/down draws."""
    frac, up = _sr_draws(cand, source)
    assert frac.size > 700_000, frac.size
    bins = np.minimum((frac * 10).astype(np.int64), 9)
    for b in range(10):
        sel = bins == b
        p, rate, n = float(frac[sel].mean()), float(up[sel].mean()), int(sel.sum())
        tol = 4.5 * np.sqrt(p * (1 - p) / n) + 0.002
        assert abs(rate - p) <= tol, f"{cand.name}: fractional part in [{b / 10:.1f}, {(b + 1) / 10:.1f}): " \
                                     f"rounded up {rate:.4f} of {n}, expected {p:.4f} +- {tol:.4f}"
    return up


def test_stochastic_rounding_is_unbiased(source) -> None:
    """Each stochastic-rounding candidate's codes are unbiased random roundings of the source weights,
    and the two seeds drew independently: they disagree on a weight with probability 2 f (1 - f)."""
    up1 = check_stochastic_rounding(CAND_DIR / "int4_g32_sr1", source)
    up2 = check_stochastic_rounding(CAND_DIR / "int4_g32_sr2", source)
    frac, _ = _sr_draws(CAND_DIR / "int4_g32_sr1", source)
    expected = float((2 * frac * (1 - frac)).mean())
    differ = float((up1 != up2).mean())
    assert abs(differ - expected) <= 4.5 * np.sqrt(expected * (1 - expected) / frac.size) + 0.002, (differ, expected)


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
def test_kld_matches_independent_dequantization(source, models) -> None:
    """Each loaded candidate's token-mean KL(bf16 || candidate), the forward run in float64, equals that of
    the reference model carrying this file's own numpy dequantization of the candidate's files (float64
    throughout, so only summation order separates the two: rel 1e-6); the values order by bits."""
    import copy

    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    docs = [ln for ln in (FIXTURES / "corpus" / "heldout.txt").read_text().split("\n") if ln][:8]
    ids = [tok.encode((FIXTURES / "corpus" / d).read_text()[:4000]).ids[:256] for d in docs]
    x = torch.tensor([i for i in ids if len(i) == 256][:6])
    assert len(x) == 6
    ref = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), dtype=torch.float64, attn_implementation="eager").eval()

    def log_probs(model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(input_ids=x).logits.double(), -1)

    lp = log_probs(ref)
    kld, want = {}, {}
    for name in ("int8", "int4_g32", "int3_g32", "int4_g32_sr1"):
        raw = load_pt(str(CAND_DIR / name / "model.safetensors"))
        stored = {k: _bf16_as_f64(v) for k, v in raw.items() if k.endswith(".scales")}
        stored.update({k: v.numpy() for k, v in raw.items() if k.endswith(".qweight")})
        independent = copy.deepcopy(ref)
        with torch.no_grad():
            for key, p in independent.named_parameters():
                prefix = key.removesuffix(".weight")
                if prefix.rsplit(".", 1)[-1] in LINEARS:
                    p.copy_(torch.from_numpy(rne(expected_weight(name, source[key], stored, prefix), 7)))
        want[name] = float((lp.exp() * (lp - log_probs(independent))).sum(-1).mean())
        lq = log_probs(copy.deepcopy(models[name]).to(torch.float64))
        kld[name] = float((lp.exp() * (lp - lq)).sum(-1).mean())
        assert kld[name] == pytest.approx(want[name], rel=1e-6), (name, kld[name], want[name])
    assert 0 < want["int8"] < want["int4_g32"] < want["int3_g32"], want
