"""The precision floor beside the ladder (harness/run/floor_cache.py): the sample rule, the signed cache (a
second run reads it, a tampered or foreign file is measured again), a sampled floor with a window against an
independent float64 forward, and the ladder's ratio and "indistinguishable" mark."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy.special import log_softmax, rel_entr

from harness.capture.cache_sign import UntrustedCacheWarning
from harness.inputs.config import load_config
from harness.inputs.suite import Suite
from harness.reports.aggregate import INDISTINGUISHABLE, annotate_floor, format_ladder
from harness.run import floor_cache
from harness.run.floor_cache import FLOOR_BUDGET, MIN_SAMPLE, floor_contexts, floor_for_run

ROOT = Path(__file__).resolve().parents[1]
FX = ROOT / "fixtures"
KEY = b"k" * 32


def test_whole_shards_within_the_budget_and_an_even_sample_beyond() -> None:
    suite = Suite.load(FX / "suite")
    everything = suite.context_indices(suite.parse_shards(None))
    assert floor_contexts(suite, None, 1_312_128) == (everything, None)
    rows = suite.n_ctx - 1
    params = int(FLOOR_BUDGET // (40 * rows))  # 40 contexts fit the budget
    picked, sample = floor_contexts(suite, None, params)
    assert sample is not None and len(picked) == 40 == sample["n_sampled"] and sample["n_contexts"] == len(everything)
    assert picked == [everything[int(i * len(everything) / 40)] for i in range(40)]
    picked, sample = floor_contexts(suite, None, 10**12)  # never fewer than MIN_SAMPLE
    assert len(picked) == MIN_SAMPLE and sample is not None and "a sample of 24" in str(sample["text"])


def _independent_mean(contexts: list[int], score_from: int) -> float:
    """Mean KL(P_capture || P_float64) over ``contexts``' rows >= score_from, in float64 numpy/scipy."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    suite = Suite.load(FX / "suite")
    model = AutoModelForCausalLM.from_pretrained(FX / "model", dtype=torch.bfloat16, use_safetensors=True).double().eval()
    ids = torch.from_numpy(np.asarray(suite.tokens[contexts], dtype=np.int64))
    with torch.no_grad():
        h64 = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][:, :-1].numpy()
        head = model.get_output_embeddings().weight.double().numpy()
    kl = []
    for j, c in enumerate(contexts):
        (cap,) = load_file(str(FX / "reference" / f"ctx-{c:06d}.safetensors")).values()
        lp = log_softmax(cap.double().numpy() @ head.T, axis=1)
        lq = log_softmax(h64[j] @ head.T, axis=1)
        kl.append(rel_entr(np.exp(lp), np.exp(lq)).sum(1)[score_from:])
    return float(np.concatenate(kl).mean())


@pytest.fixture()
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget that makes the fixture model's shard 5 (16 contexts) a sample of 12."""
    suite = Suite.load(FX / "suite")
    monkeypatch.setattr(floor_cache, "FLOOR_BUDGET", 1_312_128 * 12 * (suite.n_ctx - 1))
    monkeypatch.setattr(floor_cache, "MIN_SAMPLE", 4)
    monkeypatch.setattr(floor_cache, "FLOOR_N_BOOT", 300)


@pytest.mark.slow
def test_cached_sampled_floor_matches_float64_and_refuses_a_tampered_cache(tmp_path: Path, small_budget: None) -> None:
    cfg = dataclasses.replace(load_config(ROOT / "fidelity.toml"), cache_dir=tmp_path / "cache")
    floor, line = floor_for_run(cfg, shards="5", score_from=32, key=KEY)
    assert floor is not None and line.startswith("precision floor: measured")
    sample = floor["sample"]
    suite = Suite.load(FX / "suite")
    shard = suite.context_indices([5])
    picked = [shard[int(i * len(shard) / 12)] for i in range(12)]
    assert sample["n_sampled"] == 12 and floor["n_contexts"] == 12 and floor["score_from"] == 32
    assert floor["n_positions"] == 12 * (suite.n_ctx - 1 - 32)
    assert floor["kld"]["mean"] == pytest.approx(_independent_mean(picked, 32), rel=1e-3)

    again, line = floor_for_run(cfg, shards="5", score_from=32, key=KEY)  # the cache, not a second forward
    assert line.startswith("precision floor: from the cache") and again == json.loads(json.dumps(floor))

    (path,) = (tmp_path / "cache" / "precision-floor").glob("*.json")
    doc: dict[str, Any] = json.loads(path.read_text())
    doc["kld"]["mean"] = 1e-9  # a planted number with the old signature
    path.write_text(json.dumps(doc))
    with pytest.warns(UntrustedCacheWarning, match="not believed"):
        third, line = floor_for_run(cfg, shards="5", score_from=32, key=KEY)
    assert line.startswith("precision floor: measured") and third is not None
    assert third["kld"]["mean"] == pytest.approx(floor["kld"]["mean"], rel=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UntrustedCacheWarning, match="another key"):
            floor_for_run(cfg, shards="5", score_from=32, key=b"x" * 32)  # another user's key: not believed


def _row(name: str, mean: float, ci: list[float] | None) -> dict[str, Any]:
    return {"candidate": name, "bits_per_weight": None, "size_bytes": 1, "shards": [0], "mean_kld": mean, "ci95": ci,
            "p99_bounds": [0.0, 1e-3], "top1": 0.99, "verdict": "pass"}


def test_ladder_ratio_and_the_indistinguishable_mark() -> None:
    floor = {"kld": {"mean": 4.0e-5, "ci95": [3.5e-5, 4.6e-5]}}
    rows = [_row("close", 5.0e-5, [4.5e-5, 6.0e-5]), _row("far", 1.2e-4, [1.0e-4, 1.4e-4]),
            _row("touching", 8.0e-5, [4.6e-5, 9e-5])]
    annotate_floor(rows, floor)
    assert [r["vs_floor"] for r in rows] == [INDISTINGUISHABLE, "above the floor", INDISTINGUISHABLE]
    assert rows[1]["floor_ratio"] == pytest.approx(3.0, rel=1e-12)
    lines = format_ladder(rows)
    assert "× floor" in lines[0] and f"1.25× ({INDISTINGUISHABLE})" in lines[2] and "| 3× " in lines[3]
    plain = [_row("x", 1e-4, None)]
    annotate_floor(plain, None)
    assert "floor_ratio" not in plain[0] and "× floor" not in format_ladder(plain)[0]
