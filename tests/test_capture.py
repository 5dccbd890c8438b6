"""Capture with the transformers engine, the shared head, model identity, resume and concurrency."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from harness.capture.loop import capture
from harness.capture.store import CaptureStore
from harness.engines.identity import identity_key, model_identity
from harness.engines.transformers import capture_hidden, load_model
from harness.errors import FidelityError, VerificationError
from harness.inputs.head import export_head, load_head
from harness.inputs.suite import Suite


@pytest.fixture(scope="module")
def ref_store(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, tiny_suite: Path) -> Path:
    out = tmp_path_factory.mktemp("stores") / "ref"
    capture("transformers", tiny_model, tiny_suite, out, progress=False)
    return out


@pytest.fixture(scope="module")
def head_path(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    return export_head(tiny_model, tmp_path_factory.mktemp("head") / "lm_head.safetensors").path


def _files(store: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(store.glob("ctx-*.safetensors"))}


def test_hidden_times_head_reproduces_logits(ref_store: Path, tiny_suite: Path, tiny_model: Path, head_path: Path) -> None:
    suite = Suite.load(tiny_suite)
    store = CaptureStore.open(ref_store, suite)
    assert store.indices == list(range(suite.n_contexts)) and store.width == 32
    head = load_head(head_path)
    assert head.weight.shape == (300, 32) and head.weight.dtype == torch.bfloat16
    model = load_model(tiny_model)
    for i in (0, 5):
        ref = model(input_ids=torch.as_tensor(suite.tokens[i].astype(np.int64))[None]).logits[0, :-1].float()
        ours = store.load(i).float() @ head.weight.float().T
        assert ours.shape == ref.shape
        torch.testing.assert_close(ours, ref.detach(), atol=2e-2, rtol=2e-2)
    assert store.identity == model_identity(tiny_model)
    assert store.manifest["engine"]["name"] == "transformers"


def test_logits_store(tmp_path: Path, tiny_suite: Path, tiny_model: Path) -> None:
    suite = Suite.load(tiny_suite)
    store = capture("transformers", tiny_model, suite, tmp_path / "lg", shards=[1], kind="logits", progress=False)
    assert store.kind == "logits" and store.indices == [2, 3] and store.dtype == "float32"
    model = load_model(tiny_model)
    ref = model(input_ids=torch.as_tensor(suite.tokens[2].astype(np.int64))[None]).logits[0, :-1].float()
    torch.testing.assert_close(store.load(2), ref.detach())


def test_capture_hidden_is_lm_head_input(tiny_model: Path, tiny_suite: Path) -> None:
    suite = Suite.load(tiny_suite)
    model = load_model(tiny_model)
    h = capture_hidden(model, suite.tokens[0])
    out = model(input_ids=torch.as_tensor(suite.tokens[0].astype(np.int64))[None], output_hidden_states=True)
    torch.testing.assert_close(h, out.hidden_states[-1][0, :-1].to(torch.bfloat16))


def test_resume_recaptures_only_damaged(tmp_path: Path, ref_store: Path, tiny_suite: Path, tiny_model: Path) -> None:
    store = tmp_path / "s"
    shutil.copytree(ref_store, store)
    (store / "ctx-000001.safetensors").unlink()
    bad = store / "ctx-000004.safetensors"
    data = bytearray(bad.read_bytes())
    data[-3] ^= 0xFF
    bad.write_bytes(bytes(data))
    before = {p.name: p.stat().st_mtime_ns for p in store.glob("ctx-*.safetensors")}
    capture("transformers", tiny_model, tiny_suite, store, progress=False)
    after = {p.name: p.stat().st_mtime_ns for p in store.glob("ctx-*.safetensors")}
    changed = sorted(n for n in after if before.get(n) != after[n])
    assert changed == ["ctx-000001.safetensors", "ctx-000004.safetensors"]
    assert _files(store) == _files(ref_store)


_SLOW_CAPTURE = textwrap.dedent(
    """
    import sys, time
    import harness.engines.transformers as T
    model_dir, suite, out, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    orig = T.capture_hidden
    def slow(model, ids):
        time.sleep(delay)
        return orig(model, ids)
    T.capture_hidden = slow
    from harness.capture.loop import capture
    capture("transformers", model_dir, suite, out, progress=False)
    """
)


def _spawn(tmp_path: Path, model: Path, suite: Path, out: Path, delay: float) -> subprocess.Popen[bytes]:
    script = tmp_path / "slow_capture.py"
    script.write_text(_SLOW_CAPTURE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, str(script), str(model), str(suite), str(out), str(delay)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _listed(store: Path) -> int:
    try:
        return len(json.loads((store / "capture.json").read_text())["files"])
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


@pytest.mark.slow
def test_concurrent_captures_and_kill_9(tmp_path: Path, ref_store: Path, tiny_suite: Path, tiny_model: Path) -> None:
    """Two processes capture into one store; one is killed with SIGKILL mid-way. The survivor
    finishes, the store verifies and equals a clean capture, and a re-run recaptures nothing."""
    store = tmp_path / "s"
    victim = _spawn(tmp_path, tiny_model, tiny_suite, store, delay=0.4)
    survivor = _spawn(tmp_path, tiny_model, tiny_suite, store, delay=0.4)
    deadline = time.monotonic() + 90
    while _listed(store) < 2:
        assert victim.poll() is None, victim.stderr.read().decode()[-2000:] if victim.stderr else ""
        assert time.monotonic() < deadline, "capture subprocesses made no progress"
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    _out, err = survivor.communicate(timeout=120)
    assert survivor.returncode == 0, err.decode()[-2000:]
    done = {p.name: p.stat().st_mtime_ns for p in store.glob("ctx-*.safetensors")}
    assert len(done) == 6
    capture("transformers", tiny_model, tiny_suite, store, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in store.glob("ctx-*.safetensors")} == done  # nothing redone
    assert CaptureStore.open(store, Suite.load(tiny_suite)).verify_all() == 6
    assert _files(store) == _files(ref_store)


# ----------------------------------------------------------------------------- bad inputs


def test_tokenizer_vocab_larger_than_model(tmp_path: Path, tiny_suite: Path, tiny_model_factory: Any) -> None:
    small = tiny_model_factory(tmp_path / "small", vocab_size=256)
    with pytest.raises(FidelityError, match=r"small: model vocab 256 is smaller than the suite's tokenizer vocab 300"):
        capture("transformers", small, tiny_suite, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_model_folder_refusals(tmp_path: Path, tiny_model: Path, tiny_suite: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FidelityError, match=r"empty/config.json: config.json missing"):
        load_model(empty)
    noweights = tmp_path / "noweights"
    noweights.mkdir()
    shutil.copy(tiny_model / "config.json", noweights)
    with pytest.raises(FidelityError, match=r"noweights: no \*.safetensors weight files found"):
        load_model(noweights)
    pickled = tmp_path / "pickled"
    shutil.copytree(noweights, pickled)
    (pickled / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(FidelityError, match=r"pickled: only pickle weights found \(pytorch_model.bin\); the harness never loads pickle"):
        capture("transformers", pickled, tiny_suite, tmp_path / "out", progress=False)


def test_model_identity(tiny_model: Path, tmp_path: Path) -> None:
    a = model_identity(tiny_model)
    assert set(a["weights"]) == {"model.safetensors"} and len(a["config_sha256"]) == 64
    copy = shutil.copytree(tiny_model, tmp_path / "tiny-qwen3")
    assert identity_key(model_identity(copy)) == identity_key(a)
    with open(copy / "model.safetensors", "r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 1]))
    assert model_identity(copy)["weights"] != a["weights"]


# ----------------------------------------------------------------------------- head


def test_head_sidecar(head_path: Path, tiny_model: Path) -> None:
    side = json.loads(head_path.with_suffix(".json").read_text())
    assert side["vocab_size"] == 300 and side["hidden_size"] == 32 and side["dtype"] == "bfloat16"
    assert side["source_model"] == model_identity(tiny_model)
    h = load_head(head_path, expected_sha256=side["sha256"])
    emb = load_model(tiny_model).get_input_embeddings().weight
    assert torch.equal(h.weight, emb.detach())  # tied embeddings


def test_head_refusals(tmp_path: Path, head_path: Path) -> None:
    p = tmp_path / "lm_head.safetensors"
    shutil.copy(head_path, p)
    shutil.copy(head_path.with_suffix(".json"), tmp_path / "lm_head.json")
    with pytest.raises(VerificationError, match=r"lm_head.safetensors: sha256: expected 0{64}, found [0-9a-f]{64}"):
        load_head(p, expected_sha256="0" * 64)
    data = bytearray(p.read_bytes())
    data[-2] ^= 0x10
    p.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match=r"lm_head.safetensors: sha256 \(vs sidecar lm_head.json\): expected"):
        load_head(p)
    (tmp_path / "lm_head.json").unlink()
    w = load_head(head_path).weight
    cases = [
        ({"head": w}, r"tensor names: expected \['weight'\], found \['head'\]"),
        ({"weight": w.float()}, r"weight dtype: expected torch.bfloat16, found torch.float32"),
        ({"weight": w[0]}, r"weight rank: expected 2, found 1"),
        ({"weight": torch.where(torch.arange(w.numel()).view_as(w) == 7, torch.tensor(float("nan"), dtype=w.dtype), w)}, r"weight values: expected all finite, found 1 NaN/Inf"),
    ]
    for tensors, msg in cases:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(p))
        with pytest.raises(VerificationError, match=r"lm_head.safetensors: " + msg):
            load_head(p)
    p.write_bytes(head_path.read_bytes()[:50])
    with pytest.raises(VerificationError, match=r"lm_head.safetensors: corrupt or truncated safetensors"):
        load_head(p)


def test_untied_head_exports_lm_head(tmp_path: Path, tiny_model_factory: Any) -> None:
    m = tiny_model_factory(tmp_path / "untied", tie_word_embeddings=False, seed=1)
    model = load_model(m)
    h = export_head(m, tmp_path / "h.safetensors")
    assert torch.equal(h.weight, model.lm_head.weight.detach())
    assert not torch.equal(h.weight, model.get_input_embeddings().weight.detach())


def test_quantized_checkpoint_is_identified_without_its_loader(tmp_path: Path, tiny_model: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The quantization identity is read from quantization.json alone (torch-free); a bad recipe is named."""
    q = shutil.copytree(tiny_model, tmp_path / "q")
    (q / "quantization.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "harness.engines.quant_weights", None)  # the loader cannot even be imported
    with pytest.raises(VerificationError, match=r"quantization.json.*missing key 'method'"):
        model_identity(q)


def test_a_model_that_outputs_nan_is_named_before_any_file(tmp_path: Path, tiny_model: Path, tiny_suite: Path) -> None:
    """A checkpoint whose forward pass gives NaN is refused naming the model (its own output), not a store file,
    and no context file is written."""
    from safetensors.torch import load_file

    broken = tmp_path / "nan-model"
    shutil.copytree(tiny_model, broken)
    (weights,) = sorted(broken.glob("*.safetensors"))
    tensors = load_file(str(weights))
    tensors["model.norm.weight"] = torch.full_like(tensors["model.norm.weight"], float("nan"))
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(FidelityError, match=r"nan-model: the model's own hidden_states output is not finite: \d+ NaN/Inf "
                                            r"value\(s\) in context \d+ \(first at row 0, the prediction after token 0\) "
                                            r"through engine 'transformers'"):
        capture("transformers", broken, tiny_suite, tmp_path / "out", shards=[0], progress=False)
    assert not (tmp_path / "out").exists()  # checked before the store's folder is made
