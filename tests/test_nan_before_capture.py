"""A model whose output is NaN/Inf is refused, named as the model's, before its capture store exists:
the reference (captured by the session when its store is missing) and a live candidate. The broken
model is a copy of ``fixtures/model`` with one weight poisoned here (one NaN in layer 0's q_proj: every
attention output, so every hidden state after it, is NaN)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.errors import FidelityError
from harness.inputs.config import load_config
from harness.run.session import FidelitySession

ROOT = Path(__file__).resolve().parent.parent
POISONED = "model.layers.0.self_attn.q_proj.weight"


def _poisoned_model(dst: Path) -> Path:
    shutil.copytree(ROOT / "fixtures" / "model", dst)
    tensors = load_file(str(dst / "model.safetensors"))
    assert all(bool(torch.isfinite(t.float()).all()) for t in tensors.values())
    tensors[POISONED][3, 5] = float("nan")
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _config(tmp_path: Path, reference_model: Path, reference_store: Path, candidate: Path) -> Path:
    cfg = tmp_path / "fidelity.toml"
    cfg.write_text(f"""
[suite]
path = "{ROOT / 'fixtures' / 'suite'}"
[reference]
name = "bf16"
model = "{reference_model}"
store = "{reference_store}"
head = "{ROOT / 'fixtures' / 'lm_head.safetensors'}"
[settings]
cache_dir = "cache"
n_boot = 200
[[candidates]]
name = "broken"
model = "{candidate}"
""", encoding="utf-8")
    return cfg


def test_reference_with_nan_output_is_refused_before_its_store_is_written(tmp_path: Path) -> None:
    broken = _poisoned_model(tmp_path / "nan-reference")
    store = tmp_path / "reference-store"
    sess = FidelitySession(load_config(_config(tmp_path, broken, store, ROOT / "fixtures" / "candidates" / "int8")))
    first = sess.suite.context_indices(None)[0]
    with pytest.raises(FidelityError, match=rf"nan-reference: the model's own hidden_states output is not finite: \d+ "
                                            rf"NaN/Inf value\(s\) in context {first} \(first at row 0, the prediction after "
                                            r"token 0\) through engine 'transformers'"):
        _ = sess.reference
    assert not store.exists(), sorted(p.name for p in store.rglob("*"))


def test_candidate_with_nan_output_is_refused_before_its_store_is_written(tmp_path: Path) -> None:
    broken = _poisoned_model(tmp_path / "nan-candidate")
    sess = FidelitySession(load_config(_config(tmp_path, ROOT / "fixtures" / "model", ROOT / "fixtures" / "reference", broken)))
    cand = sess.config.candidate("broken")
    first = sess.suite.shard_indices(2)[0]
    with pytest.raises(FidelityError, match=rf"nan-candidate: the model's own hidden_states output is not finite: \d+ "
                                            rf"NaN/Inf value\(s\) in context {first} \(first at row 0"):
        sess.score(cand, 2, n_boot=200)
    live = sess.live_store_path(cand)
    assert not live.exists() or not any(live.iterdir()), sorted(p.name for p in live.rglob("*"))
