"""Bits per weight of every format the harness reads, counted here from the raw files: every stored tensor
loaded with safetensors (bits = elements x element size) or sized from ggml's block table, the linear
weight counts taken from the reference model's own dense shapes, never from the code under test."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from harness.allocation.bits_per_weight import bits_per_weight

FX = Path(__file__).resolve().parents[1] / "fixtures"
CANDIDATES = sorted(p.name for p in (FX / "candidates").iterdir() if p.is_dir())


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _reference_linears() -> dict[str, int]:
    """``{module: weight count}`` of the reference's decoder linears (its dense ``[out, in]`` weights)."""
    ref = _tensors(FX / "model")
    return {n[: -len(".weight")]: t.numel() for n, t in ref.items()
            if n.endswith("_proj.weight") and t.ndim == 2 and ".layers." in n}


def _bits(ts: dict[str, torch.Tensor], names: object) -> int:
    return sum(ts[n].numel() * ts[n].element_size() * 8 for n in names)  # type: ignore[attr-defined]


def _expected(folder: Path) -> tuple[int, int, int, int]:
    """(linear bits, linear weights, total bits, total params) of a folder whose quantized modules are the
    reference's decoder linears."""
    ts = _tensors(folder)
    lin = _reference_linears()
    in_q = [n for n in ts if n.rsplit(".", 1)[0] in lin and not n.endswith(".bias")]
    total_params = sum(t.numel() for t in _tensors(FX / "model").values())
    return _bits(ts, in_q), sum(lin.values()), _bits(ts, ts), total_params


@pytest.mark.parametrize("name", CANDIDATES)
def test_embedded_candidates_bits_match_the_raw_files(name: str) -> None:
    b = bits_per_weight(FX / "candidates" / name)
    lin_bits, lin_w, total_bits, params = _expected(FX / "candidates" / name)
    assert (b["linear_bits"], b["linear_weights"], b["total_bits"], b["total_params"]) == (lin_bits, lin_w, total_bits, params)
    assert b["n_quantized_modules"] == len(_reference_linears())
    assert b["linear_bpw"] == pytest.approx(lin_bits / lin_w, rel=1e-12)
    assert b["total_bpw"] == pytest.approx(total_bits / params, rel=1e-12)


@pytest.mark.parametrize(("name", "bpw", "per_module"), [("int4_g32", 4 + 16 / 32, 0), ("int3_g32", 3 + 16 / 32, 0),
                                                         ("ct_w4a16_gptq", 4 + 16 / 32, 2 * 64),
                                                         ("ct_nv_fp4a16", 4 + 8 / 16, 32)])
def test_group_formats_have_their_textbook_bits(name: str, bpw: float, per_module: int) -> None:
    """4-bit codes + one bf16 scale per 32 weights = 4.5 bits (3.5 for 3-bit codes); compressed-tensors adds its
    int64 weight_shape per module; NVFP4: 4 + one fp8 scale per 16 weights + one fp32 global scale per module."""
    b = bits_per_weight(FX / "candidates" / name)
    n_mod = len(_reference_linears())
    assert b["linear_bpw"] == pytest.approx(bpw + n_mod * per_module / b["linear_weights"], rel=1e-12)


def test_plain_folder_is_sixteen_bits_and_nothing_quantized() -> None:
    b = bits_per_weight(FX / "model")
    assert b["format"] == "plain" and b["linear_bpw"] is None and b["total_bpw"] == 16.0


def test_torchao_unpacked_int4_says_so(tmp_path: Path) -> None:
    """torchao's IntxWeightOnlyConfig(int4) stores one code per int8: 8 bits + a bf16 scale and an int8 zero per 32."""
    pytest.importorskip("torchao", reason="torchao is not installed")
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup
    from transformers import AutoModelForCausalLM, TorchAoConfig

    cfg = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))
    model = AutoModelForCausalLM.from_pretrained(FX / "model", dtype=torch.bfloat16, use_safetensors=True,
                                                 quantization_config=TorchAoConfig(cfg))
    model.save_pretrained(tmp_path, safe_serialization=True)
    b = bits_per_weight(tmp_path)
    lin_bits, lin_w, total_bits, params = _expected(tmp_path)
    assert (b["format"], b["linear_bits"], b["linear_weights"], b["total_bits"], b["total_params"]) == (
        "torchao", lin_bits, lin_w, total_bits, params)
    assert b["linear_bpw"] == 8 + (16 + 8) / 32
    assert b["note"] is not None and "unpacked" in b["note"] and "int4" in b["note"]


@pytest.mark.parametrize("name", ["fixture-q8_0.gguf", "fixture-q4_0.gguf", "fixture-q4_k_m.gguf", "fixture-bf16.gguf"])
def test_gguf_bits_from_ggml_block_sizes(name: str) -> None:
    """Each tensor's bits from ggml's (block size, block bytes) table and its element count, over the file's tensors."""
    gguf = pytest.importorskip("gguf")
    path = FX / "gguf" / name
    ts = gguf.GGUFReader(str(path)).tensors
    floats = {"F32", "F16", "BF16", "F64"}
    q_bits = q_w = total_bits = other = 0
    for t in ts:
        n = math.prod(int(x) for x in t.shape)
        block, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
        bits = n // block * size * 8
        total_bits += bits
        if t.tensor_type.name in floats:
            other += n
        else:
            q_bits, q_w = q_bits + bits, q_w + n
    b = bits_per_weight(path)
    assert (b["linear_bits"], b["linear_weights"], b["total_bits"], b["total_params"]) == (q_bits, q_w, total_bits, q_w + other)


def test_auto_round_checkpoint(tmp_path: Path) -> None:
    """An AutoRound export (round-to-nearest, iters=0): int32-packed qweight, qzeros, scales."""
    auto_round = pytest.importorskip("auto_round", reason="auto-round is not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(FX / "model", dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(FX / "model")
    ar = auto_round.AutoRound(model, tok, bits=4, group_size=32, sym=True, iters=0, nsamples=2, seqlen=32)
    ar.quantize_and_save(str(tmp_path), format="auto_round")
    b = bits_per_weight(tmp_path)
    lin_bits, lin_w, total_bits, params = _expected(tmp_path)
    assert (b["format"], b["linear_bits"], b["linear_weights"], b["total_bits"]) == ("gptq-like", lin_bits, lin_w, total_bits)
    assert b["linear_bpw"] is not None and 4.5 <= b["linear_bpw"] < 5.5
