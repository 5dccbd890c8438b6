"""The precision floor (harness/run/precision_floor.py) against an independent float64 computation:
the fixture model's own forward in float64 (``output_hidden_states``, no hook, no batching), logits
and KL formed in float64 numpy/scipy from the committed capture and the head's bf16 values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import log_softmax, rel_entr

from harness.cli.main import main
from harness.run.precision_floor import precision_floor

ROOT = Path(__file__).resolve().parents[1]
FX = ROOT / "fixtures"

pytestmark = pytest.mark.slow  # a float64 forward of one shard (~10-20 s on 2 shared cores)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``fidelity precision-floor`` on shard 5 of the embedded configuration (one float64 forward)."""
    out = tmp_path_factory.mktemp("floor")
    threads = torch.get_num_threads()
    rc = main(["precision-floor", "--config", str(ROOT / "fidelity.toml"), "--shards", "5", "--n-boot", "500",
               "--threads", "1", "--out", str(out)])
    torch.set_num_threads(threads)  # --threads sets the process's torch threads
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def floor(out_dir: Path) -> dict:
    doc: dict = json.loads((out_dir / "precision_floor.json").read_text())
    return doc


def test_floor_matches_independent_float64(floor: dict) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from harness.inputs.suite import Suite

    suite = Suite.load(FX / "suite")
    idx = suite.shard_indices(5)
    model = AutoModelForCausalLM.from_pretrained(FX / "model", dtype=torch.bfloat16, use_safetensors=True).double().eval()
    ids = torch.from_numpy(np.asarray(suite.tokens[idx], dtype=np.int64))
    with torch.no_grad():
        h64 = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][:, :-1].numpy()  # after the final norm
    with torch.no_grad():
        head = model.get_output_embeddings().weight.double().numpy()
    kl = []
    for j, c in enumerate(idx):
        (cap,) = load_file(str(FX / "reference" / f"ctx-{c:06d}.safetensors")).values()
        cap64 = cap.double().numpy()  # bf16 -> float64 is exact
        lp = log_softmax(cap64 @ head.T, axis=1)
        lq = log_softmax(h64[j] @ head.T, axis=1)
        kl.append(rel_entr(np.exp(lp), np.exp(lq)).sum(1))
    want = np.concatenate(kl)
    assert floor["n_positions"] == want.size
    assert floor["kld"]["mean"] == pytest.approx(want.mean(), rel=1e-3)
    assert floor["kld"]["max"] == pytest.approx(want.max(), rel=1e-3)
    assert 0 < floor["kld"]["ci95"][0] < floor["kld"]["mean"] < floor["kld"]["ci95"][1]


def test_cli_writes_the_floor(out_dir: Path, floor: dict) -> None:
    assert floor["schema"] == "fidelity.precision-floor/1" and floor["compute"]["dtype"] == "float64"
    assert floor["suite"]["shards"] == [5] and floor["bootstrap"]["method"] == "studentized"
    assert "Precision floor of the reference" in (out_dir / "precision_floor.md").read_text()


def test_refuses_an_unknown_dtype() -> None:
    from harness.errors import FidelityError

    with pytest.raises(FidelityError, match="--dtype: expected one of float64, float32, found 'bfloat16'"):
        precision_floor(suite_path=FX / "suite", model_dir=FX / "model", store_path=FX / "reference",
                        head_path=FX / "lm_head.safetensors", dtype="bfloat16")


def test_ladder_shows_a_floor_of_its_suite_only(floor: dict, tmp_path: Path) -> None:
    from harness.reports.aggregate import ladder_files

    rows: list[dict] = []
    files = ladder_files(tmp_path, rows, floor)
    assert "Precision floor of the reference" in files[tmp_path / "ladder.md"]
    assert json.loads(files[tmp_path / "ladder.json"])["precision_floor"]["mean"] == floor["kld"]["mean"]
