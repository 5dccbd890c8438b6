"""Quantization configurations checked against the weights: compressed-tensors, NVFP4/FP8 and
mixed-scheme configurations that lie are refused group by group; the fixtures pass.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.errors import VerificationError

_FIX = Path(__file__).resolve().parents[1] / "fixtures" / "candidates"


def _ct_copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(_FIX / name, dst)
    return dst


def _edit_weights(root: Path, edit: Any) -> None:
    from safetensors.torch import load_file, save_file

    for f in root.glob("*.safetensors"):
        tensors = load_file(f)
        edit(tensors)
        save_file(tensors, f, metadata={"format": "pt"})


@pytest.mark.parametrize("case, pattern", [
    ("num_bits", r"model\.safetensors: model\.layers\.0\.mlp\.down_proj\.weight_packed shape \(config\.json quantization_config"
                 r"\.config_groups\.group_0\.weights\.num_bits 3, weight_shape \[128, 384\]\): expected \[128, 36\], found \[128, 48\]"),
    ("weight_shape", r"q_proj\.weight_packed shape .*weight_shape \[128, 100\]\): expected \[128, 13\], found \[128, 16\]"),
    ("packed_dtype", r"down_proj\.weight_packed dtype \(config\.json .*pack-quantized\): expected I32, found I16"),
    ("group_size", r"down_proj\.weight_scale shape \(config\.json .*group, group_size 64\): expected \[128, 6\], found \[128, 12\]"),
    ("string_bits", r"config\.json: quantization_config\.config_groups\.group_0\.weights\.num_bits: expected an integer, found a string '4'"),
])
def test_compressed_tensors_config_that_lies_is_refused(tmp_path: Path, case: str, pattern: str) -> None:
    """compressed-tensors believes its configuration (a checkpoint saying 3 bits while packed 4 loads without a
    word and computes garbage): the harness checks it against the stored tensors first and names the file, the
    tensor, the expected and the found value; the untouched checkpoint loads."""
    import torch

    from harness.engines.transformers import load_model

    root = _ct_copy(tmp_path, "ct_w4a16_rtn")
    cfg = json.loads((root / "config.json").read_text())
    weights = cfg["quantization_config"]["config_groups"]["group_0"]["weights"]
    if case == "num_bits":
        weights["num_bits"] = 3
    elif case == "group_size":
        weights["group_size"] = 64
    elif case == "string_bits":
        weights["num_bits"] = "4"
    elif case == "weight_shape":
        _edit_weights(root, lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.weight_shape", torch.tensor([128, 100])))
    elif case == "packed_dtype":
        _edit_weights(root, lambda t: t.__setitem__("model.layers.0.mlp.down_proj.weight_packed",
                                                    t["model.layers.0.mlp.down_proj.weight_packed"].to(torch.int16)))
    (root / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VerificationError, match=pattern):
        load_model(root)


def test_compressed_tensors_fixtures_pass_the_check() -> None:
    """Every real compressed-tensors checkpoint of the fixtures (int4 packed, GPTQ, NVFP4, FP8) passes."""
    from harness.engines.compressed_config import check_compressed_tensors

    for name in ("ct_w4a16_rtn", "ct_w4a16_gptq", "ct_nv_fp4a16", "ct_fp8_dynamic"):
        check_compressed_tensors(_FIX / name)


def test_nvfp4_and_fp8_lies_are_refused(tmp_path: Path) -> None:
    from harness.engines.compressed_config import check_compressed_tensors

    root = _ct_copy(tmp_path, "ct_nv_fp4a16")
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32
    (root / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VerificationError, match=r"weight_scale shape \(config\.json .*group_size 32\): expected \[\d+, \d+\], found"):
        check_compressed_tensors(root)
    root = _ct_copy(tmp_path, "ct_fp8_dynamic")
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 4
    (root / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VerificationError, match=r"weight dtype \(config\.json .*num_bits 4, float-quantized\): "
                                                r"expected F8_E4M3 or F8_E5M2 with num_bits 8, found F8_E4M3 with num_bits 4"):
        check_compressed_tensors(root)


# ----------------------------------------------------------------------------- mixed-scheme compressed-tensors

_MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "model"
_INT4 = r"re:.*mlp\.(gate|up)_proj$"
_INT8 = r"re:.*self_attn\.(q|k|v|o)_proj$"
_FP8 = r"re:.*down_proj$"


def _build_mixed(dst: Path) -> Path:
    """A real compressed-tensors checkpoint of the fixture model with three schemes, made by the
    ``compressed-tensors`` package itself: int4 groups of 32 (packed) on gate/up, int8 per channel (packed) on
    the attention projections, fp8 per channel on down_proj, and layer 1's down_proj ignored (bf16).
    Round-to-nearest: each scale from the weights' min/max by compressed-tensors' ``calculate_qparams``."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(_MODEL, dtype=torch.bfloat16)
    groups = {
        "int4": QuantizationScheme(targets=[_INT4], weights=QuantizationArgs(num_bits=4, type="int", symmetric=True,
                                                                            strategy="group", group_size=32)),
        "int8": QuantizationScheme(targets=[_INT8], weights=QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel")),
        "fp8": QuantizationScheme(targets=[_FP8], weights=QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="channel")),
    }
    apply_quantization_config(model, QuantizationConfig(config_groups=groups, ignore=["lm_head", "model.layers.1.mlp.down_proj"]))
    for _name, m in model.named_modules():
        scheme = getattr(m, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        a, w = scheme.weights, m.weight.data.float()
        rows = w.reshape(w.shape[0], -1, a.group_size) if a.strategy == "group" else w.unsqueeze(1)
        scale, zp = calculate_qparams(rows.amin(-1), rows.amax(-1), a)
        m.weight_scale.data.copy_(scale.to(m.weight_scale.dtype).reshape(m.weight_scale.shape))
        m.weight_zero_point.data.copy_(zp.to(m.weight_zero_point.dtype).reshape(m.weight_zero_point.shape))
        m.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(dst)
    compressor.update_config(str(dst))
    return dst


@pytest.fixture(scope="module")
def mixed_ct(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_mixed(tmp_path_factory.mktemp("ct") / "mixed")


def _mixed_copy(mixed_ct: Path, tmp_path: Path) -> tuple[Path, dict[str, Any], dict[str, str]]:
    """A copy of the mixed checkpoint, its ``quantization_config`` and the group key of each scheme."""
    root = tmp_path / "m"
    shutil.copytree(mixed_ct, root)
    qc = json.loads((root / "config.json").read_text())["quantization_config"]
    keys = {}
    for k, g in qc["config_groups"].items():  # compressed-tensors renames the groups: find them by target
        keys[{_INT4: "int4", _INT8: "int8", _FP8: "fp8"}[g["targets"][0]]] = k
    return root, qc, keys


def _write_qc(root: Path, qc: dict[str, Any]) -> None:
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"] = qc
    (root / "config.json").write_text(json.dumps(cfg))


def test_mixed_scheme_checkpoint_passes_and_loads_with_each_groups_scheme(mixed_ct: Path, tmp_path: Path) -> None:
    """The untouched checkpoint passes the check and loads through the harness; each module's loaded weight
    is within its own scheme's rounding error of the source weight (half a scale step: int4 / int8 by their
    group or channel absmax; fp8 e4m3 relative 2^-4), and layer 1's ignored down_proj is the source exactly."""
    import torch
    from transformers import AutoModelForCausalLM

    from harness.engines.compressed_config import check_compressed_tensors
    from harness.engines.transformers import load_model

    _root, qc, keys = _mixed_copy(mixed_ct, tmp_path)
    assert qc["format"] == "mixed-precision" and set(keys) == {"int4", "int8", "fp8"}
    check_compressed_tensors(mixed_ct)
    model = load_model(mixed_ct)
    with torch.inference_mode():
        model(input_ids=torch.arange(1, 9).unsqueeze(0))  # compressed-tensors decompresses on the first forward
    got = {f"{name}.weight": m.weight.detach() for name, m in model.named_modules() if isinstance(getattr(m, "weight", None), torch.Tensor)}
    src = {k: v.float() for k, v in AutoModelForCausalLM.from_pretrained(_MODEL, dtype=torch.bfloat16).named_parameters()}
    for layer in (0, 1):
        p = f"model.layers.{layer}."
        # symmetric int b: scale = absmax / (2^(b-1) - 1/2), codes clamped to [-2^(b-1), 2^(b-1) - 1] (the top value
        # rounds one code down: half a step times 2^(b-1) / (2^(b-1) - 1)); compressed-tensors divides in bf16 and the
        # scale and the result are bf16 (each at most 2^-9 |w|: 2^-7 |w| covers the three)
        for lin, g, b in (("mlp.gate_proj", 32, 4), ("self_attn.q_proj", 128, 8)):
            w, q = src[p + lin + ".weight"].double(), got[p + lin + ".weight"].double()
            absmax = w.reshape(w.shape[0], -1, g).abs().amax(-1, keepdim=True)
            step = absmax / (2 ** (b - 1) - 0.5)
            err = (q - w).reshape(w.shape[0], -1, g).abs()
            bound = step / 2 * 2 ** (b - 1) / (2 ** (b - 1) - 1) + w.reshape(err.shape).abs() * 2.0**-7
            assert bool((err <= bound).all()), (p + lin, float((err / step).max()))
            # and it is that many bits: 4-bit codes err by several 8-bit steps on average, 8-bit ones by less than one
            assert (float((err / (absmax / 127.5)).mean()) > 2.0) == (b == 4), (p + lin, b)
        w, q = src[p + "mlp.down_proj.weight"].double(), got[p + "mlp.down_proj.weight"].double()
        if layer == 1:
            assert torch.equal(w, q)  # ignored: bf16 as stored
        else:  # e4m3: 3 mantissa bits (relative 2^-4), subnormals below 2^-6 of the per-channel scale absmax / 448
            scale = w.abs().amax(-1, keepdim=True) / 448
            bound = w.abs() * 2.0**-4 + scale * 2.0**-9 + w.abs() * 2.0**-7
            assert bool(((q - w).abs() <= bound).all()) and not torch.equal(w, q)


@pytest.mark.parametrize("case, pattern", [
    ("int4_bits", r"model\.safetensors: model\.layers\.0\.mlp\.gate_proj\.weight_packed shape \(config\.json quantization_config"
                  r"\.config_groups\.{int4}\.weights\.num_bits 8, weight_shape \[384, 128\]\): expected \[384, 32\], found \[384, 16\]"),
    ("int8_bits", r"model\.safetensors: model\.layers\.0\.self_attn\.k_proj\.weight_packed shape \(config\.json .*{int8}"
                  r"\.weights\.num_bits 4, weight_shape \[64, 128\]\): expected \[64, 16\], found \[64, 32\]"),
    ("group_size", r"model\.layers\.0\.mlp\.gate_proj\.weight_scale shape \(config\.json .*{int4}\.weights: group, group_size 64\): "
                   r"expected \[384, 2\], found \[384, 4\]"),
    ("fp8_as_int", r"model\.safetensors: model\.layers\.0\.mlp\.down_proj\.weight dtype \(config\.json .*{fp8}\.weights\.num_bits 8, "
                   r"int, naive-quantized\): expected I8 with num_bits <= 8, found F8_E4M3 with num_bits 8"),
    ("format", r"config\.json: model\.layers\.0\.mlp\.down_proj tensors \(.*{fp8}\.weights: pack-quantized\): expected weight_packed, "
               r"found weight F8_E4M3 \[128, 384\], weight_scale BF16 \[128, 1\]"),
    ("shape", r"model\.safetensors: model\.layers\.1\.self_attn\.o_proj\.weight_packed shape \(config\.json .*{int8}\.weights\.num_bits 8, "
              r"weight_shape \[128, 256\]\): expected \[128, 64\], found \[128, 32\]"),
    ("overlap", r"config\.json: quantization_config\.config_groups targets matching model\.layers\.0\.mlp\.up_proj: "
                r"expected one group \(by pattern\), found 2: "),
    ("unignored", r"model\.safetensors: model\.layers\.1\.mlp\.down_proj \(config\.json .*{fp8}\.weights: naive-quantized, matched by "
                  r"pattern\): expected quantized tensors, found weight BF16 \[128, 384\]"),
    ("ignored", r"model\.safetensors: model\.layers\.0\.self_attn\.q_proj \(config\.json quantization_config\.ignore\[2\] "
                r"'model\.layers\.0\.self_attn\.q_proj'\): expected a plain weight \(an ignored module is not quantized\), "
                r"found weight_packed I32 \[128, 32\], weight_scale BF16 \[128, 1\], weight_shape I64 \[2\]"),
    ("unmatched", r"model\.safetensors: model\.layers\.0\.self_attn\.o_proj \(config\.json quantization_config\.config_groups\): "
                  r"expected a group whose targets match this quantized module, found none"),
])
def test_mixed_scheme_config_that_lies_is_refused(mixed_ct: Path, tmp_path: Path, case: str, pattern: str) -> None:
    """A lie in any one group of a mixed-scheme configuration (bits, group size, dtype, format, the stored shape),
    a module matched by two groups, an ignore list that does not fit the tensors, a quantized module no group
    matches: refused before loading, naming the file, the tensor, the expected and the found value."""
    import torch

    from harness.engines.transformers import load_model

    root, qc, keys = _mixed_copy(mixed_ct, tmp_path)
    groups = qc["config_groups"]
    if case == "int4_bits":
        groups[keys["int4"]]["weights"]["num_bits"] = 8
    elif case == "int8_bits":
        groups[keys["int8"]]["weights"]["num_bits"] = 4
    elif case == "group_size":
        groups[keys["int4"]]["weights"]["group_size"] = 64
    elif case == "fp8_as_int":
        groups[keys["fp8"]]["weights"]["type"] = "int"
    elif case == "format":
        groups[keys["fp8"]]["format"] = "pack-quantized"
    elif case == "shape":
        _edit_weights(root, lambda t: t.__setitem__("model.layers.1.self_attn.o_proj.weight_shape", torch.tensor([128, 256])))
    elif case == "overlap":
        groups[keys["int8"]]["targets"].append(r"re:.*layers\.0\.mlp\.up_proj$")
    elif case == "unignored":
        qc["ignore"].remove("model.layers.1.mlp.down_proj")
    elif case == "ignored":
        qc["ignore"].append("model.layers.0.self_attn.q_proj")
    elif case == "unmatched":
        groups[keys["int8"]]["targets"] = [r"re:.*self_attn\.(q|k|v)_proj$", r"re:.*layers\.1\.self_attn\.o_proj$"]
    _write_qc(root, qc)
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    with pytest.raises(VerificationError, match=pattern.format(**{k: re.escape(v) for k, v in keys.items()})):
        load_model(root, "cpu", "float32")
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before  # nothing written, nothing removed


def _edit_weights(root: Path, edit: Any) -> None:
    from safetensors.torch import load_file, save_file

    for f in root.glob("*.safetensors"):
        tensors = load_file(f)
        edit(tensors)
        save_file(tensors, f, metadata={"format": "pt"})
