"""``fidelity attribute`` on real checkpoint formats (harness/attribution/formats.py) and with the shard
reports' studentized intervals: compressed-tensors candidates are decompressed to their effective weights
(checked against an independent decoding of the stored codes), activation-quantizing schemes and other
quantization methods are refused in one line naming them."""

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


@pytest.mark.parametrize("method", ["torchao", "auto-round", "gptq", "awq"])
def test_other_quant_methods_are_refused_in_one_named_line(tmp_path: Path, method: str) -> None:
    from transformers.utils.quantization_config import QuantizationMethod

    assert method in {q.value for q in QuantizationMethod}  # the names these tools write into config.json
    from harness.attribution.formats import candidate_format

    with pytest.raises(FidelityError) as e:
        candidate_format(_with_quant_method(tmp_path, method))
    assert "\n" not in str(e.value) and f"cannot take apart quant_method '{method}'" in str(e.value)


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
def test_attribute_runs_on_compressed_tensors_candidates(tmp_path: Path) -> None:
    """``fidelity attribute`` by layer on ct_w4a16_gptq: studentized intervals stated in the report, effects resolved."""
    out = tmp_path / "ct"
    threads = torch.get_num_threads()
    rc = main(["attribute", "--reference", str(FX / "model"), "--candidate", str(CT_DIR / "ct_w4a16_gptq"),
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
    assert g["groups"][0]["group"] == "layer 0" and g["groups"][0]["restore"]["ci95"][0] > 0
