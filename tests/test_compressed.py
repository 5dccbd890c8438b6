"""The compressed-tensors candidates (``fixtures/candidates/ct_*``, made by ``fixtures/make_compressed.py``).

They are llm-compressor's real format, loaded by transformers through the ``compressed-tensors`` package.
The weights the loaded model actually multiplies with are checked against an independent decoding: the
safetensors header is parsed here, the stored bytes are decoded here in numpy float64 (int4 nibbles, fp8
e4m3, e2m1 codes, bf16 scales) and combined by the formats' published formulas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CAND_DIR = ROOT / "fixtures" / "candidates"
CT = ("ct_w4a16_gptq", "ct_w4a16_rtn", "ct_fp8_dynamic", "ct_nv_fp4a16")
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def read_raw(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """``{name: (dtype, shape, bytes)}`` of a safetensors file, from its JSON header (8-byte length prefix)."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    return {k: (v["dtype"], v["shape"], data[base + v["data_offsets"][0] : base + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def bf16(raw: tuple[str, list[int], bytes]) -> np.ndarray:
    dtype, shape, b = raw
    assert dtype == "BF16"
    return (np.frombuffer(b, "<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(shape)


def e4m3(raw: tuple[str, list[int], bytes]) -> np.ndarray:
    """float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; subnormal at exponent 0; 0x7f/0xff NaN."""
    dtype, shape, b = raw
    assert dtype == "F8_E4M3"
    u = np.frombuffer(b, np.uint8).astype(np.int64)
    e, m = (u >> 3) & 0xF, u & 7
    assert not ((e == 15) & (m == 7)).any(), "NaN stored"
    mag = np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * np.exp2(e - 7))
    return np.where(u >> 7, -mag, mag).reshape(shape)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round to the nearest bf16 (ties to even); ``x`` must be exact in float32 (checked)."""
    f = x.astype(np.float32)
    assert np.array_equal(f.astype(np.float64), x), "not exact in float32"
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def dequant_w4a16(t: dict[str, Any], prefix: str, group: int = 32) -> np.ndarray:
    """pack-quantized int4: 8 codes per int32, code i in bits 4i..4i+3, stored as code + 8; weight = code * scale."""
    dtype, shape, b = t[f"{prefix}.weight_packed"]
    assert dtype == "I32"
    words = np.frombuffer(b, "<u4").astype(np.int64).reshape(shape)
    codes = np.stack([(words >> (4 * i)) & 0xF for i in range(8)], axis=-1).reshape(shape[0], -1) - 8
    _, wshape, wb = t[f"{prefix}.weight_shape"]
    out_f, in_f = np.frombuffer(wb, "<i8").tolist()
    codes = codes[:, :in_f]
    scale = bf16(t[f"{prefix}.weight_scale"])
    assert scale.shape == (out_f, in_f // group)
    return codes * np.repeat(scale, group, axis=1)


def dequant_fp8(t: dict[str, Any], prefix: str) -> np.ndarray:
    """float-quantized fp8: e4m3 weight times its per-output-channel bf16 scale."""
    return e4m3(t[f"{prefix}.weight"]) * bf16(t[f"{prefix}.weight_scale"])


def dequant_nvfp4(t: dict[str, Any], prefix: str) -> np.ndarray:
    """NVFP4: two e2m1 codes per byte (low nibble first; bit 3 = sign), one e4m3 scale per 16 values, divided
    by the tensor's float32 global scale: weight = value * block_scale / global_scale."""
    dtype, shape, b = t[f"{prefix}.weight_packed"]
    assert dtype == "U8"
    u = np.frombuffer(b, np.uint8).astype(np.int64).reshape(shape)
    codes = np.stack([u & 0xF, u >> 4], axis=-1).reshape(shape[0], -1)
    values = np.where(codes & 8, -1.0, 1.0) * E2M1[codes & 7]
    block = e4m3(t[f"{prefix}.weight_scale"])
    gdtype, _, gb = t[f"{prefix}.weight_global_scale"]
    assert gdtype == "F32"
    glob = float(np.frombuffer(gb, "<f4")[0])
    return values * np.repeat(block, 16, axis=1) / glob


def loaded(name: str) -> torch.nn.Module:
    """The candidate as the transformers engine loads it, after one forward pass (compressed-tensors may
    decompress lazily)."""
    from harness.engines.transformers import load_model

    model = load_model(CAND_DIR / name)
    with torch.inference_mode():
        model(input_ids=torch.arange(1, 9).unsqueeze(0))
    return model


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: loaded(name) for name in CT}


@pytest.mark.parametrize("name", CT)
def test_folder_is_compressed_tensors(name: str) -> None:
    d = CAND_DIR / name
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                    "recipe.yaml"]
    qc = json.loads((d / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["quantization_status"] == "compressed"
    assert qc["ignore"] == ["lm_head"]
    expected = {"ct_w4a16_gptq": "pack-quantized", "ct_w4a16_rtn": "pack-quantized",
                "ct_fp8_dynamic": "float-quantized", "ct_nv_fp4a16": "nvfp4-pack-quantized"}[name]
    assert qc["format"] == expected


@pytest.mark.parametrize("name", CT)
def test_recipe_is_plain_yaml(name: str) -> None:
    import yaml

    recipe = yaml.safe_load((CAND_DIR / name / "recipe.yaml").read_text())
    modifiers = recipe["default_stage"]["default_modifiers"]
    assert list(modifiers) == ["GPTQModifier" if name == "ct_w4a16_gptq" else "QuantizationModifier"]


@pytest.mark.parametrize("name", CT)
def test_identity_and_size_are_the_files(name: str) -> None:
    from harness.engines.identity import model_identity
    from harness.inputs.config import CandidateConfig
    from harness.io.hashing import sha256_file
    from harness.run.session import candidate_size_bytes

    d = CAND_DIR / name
    ident = model_identity(d)
    assert ident["weights"] == {"model.safetensors": sha256_file(d / "model.safetensors")}
    assert ident["config_sha256"] == sha256_file(d / "config.json")
    cand = CandidateConfig(name=name, engine="transformers", model=d, store=None, head=None, size_bytes=None, tags=())
    assert candidate_size_bytes(cand) == (d / "model.safetensors").stat().st_size


@pytest.mark.parametrize("name,decode,exact", [
    ("ct_w4a16_gptq", dequant_w4a16, True),
    ("ct_w4a16_rtn", dequant_w4a16, True),
    ("ct_fp8_dynamic", dequant_fp8, True),
    ("ct_nv_fp4a16", dequant_nvfp4, False),
])
def test_loaded_weights_match_independent_dequantization(name: str, decode: Any, exact: bool, models: Any) -> None:
    """Every quantized linear's weight in the loaded model equals the stored codes x scales decoded here: bit
    for bit after one rounding to bf16 (int4 x bf16 and e4m3 x bf16 products are exact in float32), and within
    one bf16 rounding for NVFP4 (its scale is a quotient)."""
    t = read_raw(CAND_DIR / name / "model.safetensors")
    model = models[name]
    n = 0
    for layer in range(len(model.model.layers)):
        for lin in LINEARS:
            prefix = f"model.layers.{layer}.{lin}"
            w = model.get_submodule(prefix).weight.detach()
            assert w.dtype == torch.bfloat16, (prefix, w.dtype)
            got = w.double().numpy()
            want = decode(t, prefix)
            assert got.shape == want.shape, prefix
            if exact:
                np.testing.assert_array_equal(got, round_bf16(want), err_msg=prefix)
            else:
                np.testing.assert_allclose(got, want, rtol=2.0**-8, atol=0, err_msg=prefix)
            n += 1
    assert n == 28
    # Embeddings and norms stay bf16 as stored (the tied head is the embedding).
    emb = bf16(t["model.embed_tokens.weight"])
    np.testing.assert_array_equal(model.get_input_embeddings().weight.detach().double().numpy(), emb)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_rtn_is_round_to_nearest_of_the_source_and_gptq_is_not() -> None:
    """The RTN candidate re-derived from the bf16 source: per group of 32, scale = absmax / 7.5 rounded to bf16
    (symmetric int4 spans -8..7, half-range 7.5), codes = clip(round(w / scale), -8, 7) with the quotient taken in
    bf16 like the library's bf16 arithmetic -- every code and scale exact. GPTQ (same scheme, calibrated)
    moved a visible share of the codes away from round-to-nearest on every linear."""
    source = read_raw(ROOT / "fixtures" / "model" / "model.safetensors")
    gptq = read_raw(CAND_DIR / "ct_w4a16_gptq" / "model.safetensors")
    rtn = read_raw(CAND_DIR / "ct_w4a16_rtn" / "model.safetensors")
    for layer in range(4):
        for lin in LINEARS:
            prefix = f"model.layers.{layer}.{lin}"
            w = bf16(source[f"{prefix}.weight"])
            groups = w.reshape(w.shape[0], -1, 32)
            scale = bf16(rtn[f"{prefix}.weight_scale"])
            np.testing.assert_array_equal(scale, round_bf16((np.abs(groups).max(-1) / 7.5).astype(np.float32)
                                                            .astype(np.float64)), err_msg=prefix)
            full = np.repeat(scale, 32, axis=1)
            codes = np.clip(np.round(round_bf16((w / full).astype(np.float32).astype(np.float64))), -8, 7)
            np.testing.assert_array_equal(dequant_w4a16(rtn, prefix), codes * full, err_msg=prefix)
            assert np.mean(dequant_w4a16(gptq, prefix) != codes * full) > 0.05, prefix
