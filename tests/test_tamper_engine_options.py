"""Tamper campaign, engine options and checkpoints: checked against the machine and the model before loading.

A tiny real Qwen3 checkpoint (transformers' own ``save_pretrained``) is loaded through the harness's loader with
ONE hostile option or ONE edited file; each refusal is one line naming the option or the tensor, the expected
and the found value, with no raw torch/transformers exception. The device that does not exist is computed from
this machine (``cuda:<visible count>``), so the case holds on any machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.engines.transformers import load_model
from harness.errors import FidelityError, MissingPackageError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, tiny_model_factory: Any) -> Path:
    return Path(tiny_model_factory(tmp_path_factory.mktemp("tiny") / "m"))


def _copy(tiny: Path, dst: Path) -> Path:
    shutil.copytree(tiny, dst)
    return dst


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


def test_wrong_shape_checkpoint_refused_naming_the_tensor(tiny: Path, tmp_path: Path) -> None:
    m = _copy(tiny, tmp_path / "m")
    cfg = json.loads((m / "config.json").read_text())
    cfg["intermediate_size"] = 96  # the stored MLP weights are [64, 32] / [32, 64]
    (m / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FidelityError) as exc:
        load_model(m)
    msg = _one_line(exc)
    assert msg.startswith(f"{m / 'model.safetensors'}: tensor model.layers.0.mlp.")
    assert "expected shape [96, 32]" in msg or "expected shape [32, 96]" in msg, msg
    assert "found [64, 32]" in msg or "found [32, 64]" in msg, msg
    assert str(m / "config.json") in msg


def test_valid_checkpoint_and_options_load(tiny: Path) -> None:
    assert load_model(tiny, options={"device_map": "cpu"}) is not None


def _cuda_missing() -> str:
    import torch

    return f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"


@pytest.mark.parametrize(("options", "pattern"), [
    ({"device_map": "meta"}, r"option device_map: expected a device that computes \(cpu, cuda:N\), found 'meta'"),
    ({"device_map": "disk"}, r"option device_map: expected a device that computes \(cpu, cuda:N\), found 'disk'"),
    ({"device_map": "CUDA_MISSING"}, r"option device_map: expected a CUDA device this machine has \(\d+ visible: .*\), found 'cuda:\d+'"),
    ({"device_map": {"model.no_such_module": "cpu", "": "cpu"}},
     r"option device_map: expected module names of the model \(like .*\), found 'model\.no_such_module'"),
    ({"device_map": {"": "meta"}}, r"option device_map\[''\]: expected a device that computes"),
    ({"device_map": "auto", "max_memory": {"cpu": "10KiB"}},
     r"option max_memory: expected budgets holding the weights \(\d+ bytes, [0-9.]+ GiB\), found 10240 bytes in all \(cpu = 10240\)"),
    ({"device_map": "auto", "max_memory": {"cpu": "\u00b2GiB"}}, r"option max_memory\['cpu'\]: expected a size like '70GiB'"),
    ({"device_map": "auto", "max_memory": {"cpu": "1e999GiB"}}, r"option max_memory\['cpu'\]: expected a size like '70GiB'"),
])
def test_engine_option_refused_before_loading(tiny: Path, options: dict[str, Any], pattern: str) -> None:
    if options.get("device_map") == "CUDA_MISSING":
        options = {"device_map": _cuda_missing()}
    with pytest.raises(FidelityError, match=rf"^{tiny}: engine 'transformers' " + pattern) as exc:
        load_model(tiny, options=options)
    _one_line(exc)


def test_missing_flash_attention_blames_the_option(tiny: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    with pytest.raises(MissingPackageError, match=rf"^{tiny}: engine 'transformers' option attn_implementation = "
                                                  r"'flash_attention_2': flash-attn is not installed") as exc:
        load_model(tiny, options={"attn_implementation": "flash_attention_2"})
    assert "config.json" not in str(exc.value)


def test_quantized_checkpoint_floating_tensor_of_another_shape_refused(tmp_path: Path) -> None:
    """A compressed-tensors checkpoint (``quantization_config``) whose unquantized ``model.norm.weight`` (stored in
    BF16 under the parameter's name) holds another shape is refused before loading, naming the file, the tensor and
    both shapes; its packed tensors (I32) keep their own shapes and are not compared."""
    from safetensors.torch import load_file, save_file

    m = tmp_path / "ct"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "candidates" / "ct_w4a16_rtn", m)
    f = next(p for p in sorted(m.glob("*.safetensors")) if "model.norm.weight" in load_file(p))
    tensors = load_file(f)
    width = tensors["model.norm.weight"].shape[0]
    tensors["model.norm.weight"] = tensors["model.norm.weight"][: width // 2].clone()
    save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(FidelityError) as exc:
        load_model(m)
    msg = _one_line(exc)
    assert msg == (f"{f}: tensor model.norm.weight: expected shape [{width}] (from {m / 'config.json'}), "
                   f"found [{width // 2}]"), msg
