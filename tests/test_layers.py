"""``fidelity layers`` (harness/attribution/layers.py) on the embedded int3 candidate: its numbers against an
independent float64 computation from transformers' own hidden states and the checkpoints' weights, and its
ranking of the worst layers against the ablation's (``fidelity attribute`` by layer)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
FX = ROOT / "fixtures"
CAND = FX / "candidates" / "int3_g32"

pytestmark = pytest.mark.slow  # two model loads and an attribution by layer (~40 s on 2 shared cores)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: on 2 shared, loaded cores OpenMP's two threads make these small forwards ~20x slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("layers")
    rc = main(["layers", "--reference", str(FX / "model"), "--candidate", str(CAND), "--suite", str(FX / "suite"),
               "--shards", "0", "--contexts", "2", "--out", str(out)])
    assert rc == 0
    assert (out / "layers.md").read_text().startswith("# Per-layer error")
    assert (out / "layers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc: dict = json.loads((out / "layers.json").read_text())
    return doc


def _stats(r: np.ndarray, c: np.ndarray) -> tuple[float, float, float]:
    r, c = r.reshape(-1, r.shape[-1]), c.reshape(-1, c.shape[-1])
    err = ((c - r) ** 2).sum()
    cos = (r * c).sum(1) / np.linalg.norm(r, axis=1) / np.linalg.norm(c, axis=1)
    return float(np.sqrt(err / (r**2).sum())), float(1 - cos.mean()), float(10 * np.log10((r**2).sum() / err))


def test_free_running_and_module_errors_match_float64(result: dict) -> None:
    from transformers import AutoModelForCausalLM

    from harness.engines.transformers import load_model
    from harness.inputs.suite import Suite

    suite = Suite.load(FX / "suite")
    ids = torch.from_numpy(np.asarray(suite.tokens[result["suite"]["contexts"]], dtype=np.int64))
    ref = AutoModelForCausalLM.from_pretrained(FX / "model", dtype=torch.bfloat16, use_safetensors=True).double().eval()
    cand = load_model(CAND, dtype="bfloat16").double().eval()
    with torch.no_grad():
        hr = [h.numpy() for h in ref(input_ids=ids, output_hidden_states=True).hidden_states]
        hc = [h.numpy() for h in cand(input_ids=ids, output_hidden_states=True).hidden_states]
    n = len(result["layers"])
    for i in range(n - 1):  # hidden_states[i + 1] is layer i's output (the last one is after the final norm)
        rel, cos, sq = _stats(hr[i + 1], hc[i + 1])
        got = result["layers"][i]["free_running"]
        assert got["rel_frobenius"] == pytest.approx(rel, rel=1e-3)
        assert got["cosine_error"] == pytest.approx(cos, rel=1e-2, abs=1e-7)
        assert got["sqnr_db"] == pytest.approx(sq, abs=1e-2)
    # q_proj of layer 0 fed the reference's input: RMSNorm of the embeddings, then both weights, in numpy
    sd_r = {k: v.double().numpy() for k, v in ref.state_dict().items()}
    sd_c = {k: v.double().numpy() for k, v in cand.state_dict().items()}
    x = hr[0]
    eps = ref.config.rms_norm_eps
    xn = x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * sd_r["model.layers.0.input_layernorm.weight"]
    w = "model.layers.0.self_attn.q_proj.weight"
    rel, cos, sq = _stats(xn @ sd_r[w].T, xn @ sd_c[w].T)
    (row,) = [m for m in result["modules"] if m["layer"] == 0 and m["name"] == "self_attn.q_proj"]
    assert row["rel_frobenius"] == pytest.approx(rel, rel=1e-3)
    assert row["sqnr_db"] == pytest.approx(sq, abs=1e-2)
    # layer 0 has the same input in both modes (the embeddings are not quantized)
    assert result["layers"][0]["teacher_forced"] == result["layers"][0]["free_running"]
    kinds = {k["kind"]: k for k in result["by_kind"]}
    assert set(kinds) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert all(k["n_modules"] == n for k in kinds.values())


def test_worst_layers_agree_with_the_ablation(result: dict) -> None:
    """The teacher-forced ranking of the layers is the attribution's ranking by ΔKLD restore."""
    from harness.attribution.run import attribute, request_from

    r = attribute(request_from(FX / "model", CAND, FX / "suite", shards="0", by="layer", modes="restore",
                               progress=False, n_boot=500))
    (g,) = r["groupings"]
    by_effect = [int(x["group"].split()[-1]) for x in sorted(g["groups"], key=lambda x: -x["restore"]["value"])]
    assert result["ranking"][0] == by_effect[0] == 0
    assert result["ranking"] == by_effect
