"""``fidelity attribute`` on real checkpoint formats (harness/attribution/formats.py) and with the shard
reports' studentized intervals: compressed-tensors candidates and a torchao checkpoint built here are
decompressed to their effective weights (checked against an independent decoding / quantization in
numpy), activation-quantizing schemes and other quantization methods are refused in one line naming them."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from harness.cli.main import main
from harness.errors import FidelityError

ROOT = Path(__file__).resolve().parents[1]
FX = ROOT / "fixtures"
CT_DIR = FX / "candidates"


def _decoders() -> Any:
    """The independent numpy decoders of tests/test_compressed.py (stored codes x scales, no compressed-tensors)."""
    spec = importlib.util.spec_from_file_location("_ct_decoders", Path(__file__).with_name("test_compressed.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_compressed_tensors_candidate_swaps_its_effective_weights() -> None:
    from harness.attribution.ablation import load_models

    dec = _decoders()
    m = load_models(FX / "model", CT_DIR / "ct_w4a16_gptq")
    assert len(m.params) == 28 and all(p.endswith("_proj.weight") for p in m.params)
    raw = dec.read_raw(CT_DIR / "ct_w4a16_gptq" / "model.safetensors")
    for p in m.params:
        want = dec.round_bf16(dec.dequant_w4a16(raw, p.removesuffix(".weight")))
        np.testing.assert_array_equal(m.cand_values[p].double().numpy(), want, err_msg=p)
    # the module in memory holds the candidate's values (the variant with nothing restored)
    named = dict(m.model.named_parameters())
    assert all(torch.equal(named[p], m.cand_values[p]) for p in m.params)
    m.set_variant(m.params)
    assert all(torch.equal(named[p], m.ref_values[p]) for p in m.params)


def _with_quant_method(tmp_path: Path, method: str) -> Path:
    folder = tmp_path / method
    shutil.copytree(FX / "model", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": method, "bits": 4}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("method", ["auto-round", "gptq", "awq", "bitsandbytes"])
def test_other_quant_methods_are_refused_in_one_named_line(tmp_path: Path, method: str) -> None:
    from transformers.utils.quantization_config import QuantizationMethod

    assert method in {q.value for q in QuantizationMethod}  # the names these tools write into config.json
    from harness.attribution.formats import candidate_format

    with pytest.raises(FidelityError) as e:
        candidate_format(_with_quant_method(tmp_path, method))
    assert "\n" not in str(e.value) and f"cannot take apart quant_method '{method}'" in str(e.value)


@pytest.fixture(scope="module")
def torchao_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture model quantized by torchao (Int8WeightOnlyConfig, per row) through transformers and saved
    as safetensors: a checkpoint as torchao users write it."""
    pytest.importorskip("torchao", reason="torchao is not installed (pip install -e '.[torchao]')")
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import AutoModelForCausalLM, TorchAoConfig

    out = tmp_path_factory.mktemp("torchao") / "int8wo"
    model = AutoModelForCausalLM.from_pretrained(FX / "model", dtype=torch.bfloat16, use_safetensors=True,
                                                 quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))
    model.save_pretrained(out, safe_serialization=True)
    return out


def _bf16(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).to(torch.bfloat16).double().numpy()


def test_torchao_candidate_swaps_its_dequantized_weights(torchao_checkpoint: Path) -> None:
    """Each swapped weight is torchao's int8 per-row symmetric quantization of the reference's, recomputed
    here: scale = bf16(max|w| / 127.5), q = round(w / scale) in [-128, 127], weight = bf16(q * scale)
    (bit for bit, except a value within 1% of a rounding tie, which torchao's lower-precision division may
    send to the neighbouring code)."""
    from harness.attribution.ablation import load_models

    m = load_models(FX / "model", torchao_checkpoint)
    assert len(m.params) == 28
    for p in m.params:
        w = m.ref_values[p].double().numpy()
        scale = _bf16(np.abs(w).max(1, keepdims=True) / 127.5)
        x = w / scale
        want = _bf16(np.clip(np.round(x), -128, 127) * scale)
        got = m.cand_values[p].double().numpy()
        # torchao divides in lower precision: a value within 1% of a rounding tie may land on the other code
        near_tie = np.abs(np.abs(x - np.floor(x)) - 0.5) < 0.01
        off = got != want
        assert not (off & ~near_tie).any(), p
        assert off.mean() < 1e-3, p


def test_torchao_activation_configuration_is_refused(torchao_checkpoint: Path, tmp_path: Path) -> None:
    from harness.attribution.formats import candidate_format

    folder = tmp_path / "dyn"
    shutil.copytree(torchao_checkpoint, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["quant_type"]["default"]["_type"] = "Int8DynamicActivationInt8WeightConfig"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FidelityError, match=r"refuses this torchao configuration \(Int8DynamicActivationInt8WeightConfig\)"):
        candidate_format(folder)


def test_activation_quantizing_scheme_is_refused_by_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["attribute", "--reference", str(FX / "model"), "--candidate", str(CT_DIR / "ct_fp8_dynamic"),
               "--suite", str(FX / "suite"), "--shards", "0", "--quiet", "--out", str(tmp_path / "out")])
    assert rc != 0 and not (tmp_path / "out").exists()
    err = capsys.readouterr().err
    assert "refuses this compressed-tensors scheme: it quantizes activations too (group_0.input_activations (float 8-bit, dynamic))" in err


def test_intervals_are_the_shard_reports_studentized_intervals() -> None:
    from harness.attribution.effects import INTERVAL_METHOD, PairedMeans
    from harness.metrics.bootstrap import MEAN_METHOD, draw_cluster_weights, ratio_intervals

    rng = np.random.default_rng(4)
    clusters = [f"d{i // 2}" for i in range(30)]
    positions = np.full(30, 50)
    sums = rng.lognormal(-3, 1, 30)
    pm = PairedMeans(clusters, positions, n_boot=800, seed=7)
    got = pm.estimate(sums, nonnegative=True)
    cl = np.repeat(np.arange(15), 2)
    w = draw_cluster_weights(15, 800, 7)
    (want,) = ratio_intervals(w, np.bincount(cl, weights=sums)[:, None], np.bincount(cl, weights=positions),
                              bounds=(0.0, np.inf))
    assert INTERVAL_METHOD == MEAN_METHOD == "studentized"
    assert got["ci95"] == want and got["value"] == pytest.approx(sums.sum() / positions.sum())


@pytest.mark.slow
@pytest.mark.parametrize("which", ["ct_w4a16_gptq", "torchao"])
def test_attribute_runs_on_real_formats(which: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """``fidelity attribute`` by layer on a compressed-tensors candidate and on the torchao checkpoint: studentized
    intervals stated in the report, the whole and the first layer's effect resolved above zero."""
    cand = CT_DIR / which if which != "torchao" else request.getfixturevalue("torchao_checkpoint")
    out = tmp_path / "ct"
    threads = torch.get_num_threads()
    rc = main(["attribute", "--reference", str(FX / "model"), "--candidate", str(cand),
               "--suite", str(FX / "suite"), "--shards", "0", "--by", "layer", "--modes", "restore", "--n-boot", "1000",
               "--threads", "1", "--quiet", "--out", str(out)])
    torch.set_num_threads(threads)  # --threads sets the process's torch threads
    assert rc == 0
    r = json.loads((out / "attribution.json").read_text())
    assert r["bootstrap"]["method"] == "studentized" and "studentized" in r["bootstrap"]["method_text"]
    assert "studentized" in (out / "attribution.md").read_text()
    assert r["differing_params"] == 28
    lo, hi = r["whole"]["ci95"]
    assert 0 < lo < r["whole"]["value"] < hi
    (g,) = r["groupings"]
    assert g["groups"][0]["restore"]["ci95"][0] > 0
