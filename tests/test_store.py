"""Capture store: round trip and every fail-closed rule (docs/design.md, section 4), without a model."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from harness.capture.store import CaptureStore, StoreWriter, context_filename
from harness.engines.identity import identity_key, runtime_identity
from harness.errors import FidelityError, VerificationError
from harness.inputs.suite import Suite
from harness.io.hashing import sha256_file

HIDDEN = 8
MODEL = {"name": "fake", "config_sha256": "0" * 64, "weights": {}}
ENGINE = {"name": "test", "version": "0"}


def _rows(suite: Suite, i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    return torch.randn(suite.n_ctx - 1, HIDDEN, generator=g).to(torch.bfloat16)


def _writer(path: Path, suite: Suite, model: dict = MODEL) -> StoreWriter:  # type: ignore[type-arg]
    return StoreWriter(path, suite, "hidden_states", HIDDEN, "bfloat16", model, ENGINE, runtime_identity(), "cpu")


@pytest.fixture()
def suite(tiny_suite: Path) -> Suite:
    return Suite.load(tiny_suite)


@pytest.fixture()
def store(tmp_path: Path, suite: Suite) -> Path:
    out = tmp_path / "store"
    with _writer(out, suite) as w:
        for i in range(suite.n_contexts):
            w.write(i, _rows(suite, i))
    return out


def _manifest(store: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((store / "capture.json").read_text())


def _save_manifest(store: Path, doc: dict) -> None:  # type: ignore[type-arg]
    (store / "capture.json").write_text(json.dumps(doc))


def _replace_file(store: Path, index: int, tensors: dict[str, torch.Tensor]) -> Path:
    """Overwrite a context file with other tensors and fix its manifest hash (so only the tensor check can catch it)."""
    p = store / context_filename(index)
    save_file(tensors, str(p))
    doc = _manifest(store)
    doc["files"][p.name]["sha256"] = sha256_file(p)
    _save_manifest(store, doc)
    return p


def test_round_trip(store: Path, suite: Suite) -> None:
    s = CaptureStore.open(store, suite)
    assert s.indices == list(range(6)) and s.kind == "hidden_states" and s.width == HIDDEN
    assert torch.equal(s.load(2), _rows(suite, 2))
    rows = s.load_rows([1, 3])
    assert rows.shape == (2 * 31, HIDDEN) and torch.equal(rows[31:], _rows(suite, 3))
    assert s.identity == MODEL
    assert s.verify_all() == 6
    assert s.missing([0, 1]) == []


def test_identity_key_is_stable() -> None:
    assert identity_key({"a": 1, "b": [1, 2]}) == identity_key({"b": [1, 2], "a": 1})
    assert identity_key({"a": 1}) != identity_key({"a": 2})


def test_manifest_missing_or_invalid(store: Path, suite: Suite) -> None:
    (store / "capture.json").write_text("{not json")
    with pytest.raises(VerificationError, match=r"capture.json: JSON: expected valid JSON"):
        CaptureStore.open(store, suite)
    (store / "capture.json").unlink()
    with pytest.raises(VerificationError, match=r"capture.json: capture manifest missing"):
        CaptureStore.open(store, suite)


def test_suite_hash_mismatch(store: Path, suite: Suite) -> None:
    doc = _manifest(store)
    doc["suite_token_sha256"] = "f" * 64
    _save_manifest(store, doc)
    with pytest.raises(VerificationError, match=r"capture.json: suite_token_sha256: expected [0-9a-f]{64}, found f{64}"):
        CaptureStore.open(store, suite)


def test_listed_file_missing(store: Path, suite: Suite) -> None:
    (store / "ctx-000004.safetensors").unlink()
    with pytest.raises(VerificationError, match=r"ctx-000004.safetensors: listed context file missing"):
        CaptureStore.open(store, suite)


def test_extra_file(store: Path, suite: Suite) -> None:
    doc = _manifest(store)
    del doc["files"]["ctx-000005.safetensors"]
    _save_manifest(store, doc)
    with pytest.raises(VerificationError, match=r"ctx-000005.safetensors: context file not listed in capture.json"):
        CaptureStore.open(store, suite)


def test_a_reader_waits_for_a_writer_between_its_file_and_its_manifest(store: Path, suite: Suite) -> None:
    """A writer renames a context file into place, then rewrites the manifest, under the store's lock: a reader
    opening the store meanwhile (another process capturing the same cache folder) waits for the manifest instead
    of refusing the file as unlisted."""
    import threading

    from filelock import FileLock

    doc = _manifest(store)
    del doc["files"]["ctx-000005.safetensors"]
    _save_manifest(store, doc)  # ctx-000005 renamed into place, the manifest not yet rewritten
    lock = FileLock(store / ".lock")
    lock.acquire()  # ... by a writer holding the store's lock
    opened: list[CaptureStore | BaseException] = []

    def read() -> None:
        try:
            opened.append(CaptureStore.open(store, suite))
        except BaseException as e:  # noqa: BLE001 -- handed to the test's thread
            opened.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(0.5)
    assert reader.is_alive() and not opened  # waiting for the writer's lock
    doc["files"]["ctx-000005.safetensors"] = {"index": 5, "sha256": sha256_file(store / "ctx-000005.safetensors")}
    _save_manifest(store, doc)  # the writer rewrites the manifest, then releases the lock
    lock.release()
    reader.join(10)
    assert len(opened) == 1 and isinstance(opened[0], CaptureStore), opened
    assert opened[0].indices == list(range(6))


def test_duplicate_index(store: Path, suite: Suite) -> None:
    shutil.copy(store / "ctx-000001.safetensors", store / "ctx-0000001.safetensors")
    doc = _manifest(store)
    doc["files"]["ctx-0000001.safetensors"] = dict(doc["files"]["ctx-000001.safetensors"])
    _save_manifest(store, doc)
    with pytest.raises(VerificationError, match=r"capture.json: duplicate context index 1"):
        CaptureStore.open(store, suite)


@pytest.mark.parametrize("name", ["../ctx-000001.safetensors", "/etc/ctx-000001.safetensors", "sub/ctx-000001.safetensors", "..\\ctx-000001.safetensors"])
def test_manifest_path_escapes(store: Path, suite: Suite, name: str) -> None:
    doc = _manifest(store)
    doc["files"][name] = doc["files"].pop("ctx-000001.safetensors")
    _save_manifest(store, doc)
    with pytest.raises(VerificationError, match=r"capture.json: file name .* leaves the store folder"):
        CaptureStore.open(store, suite)


def test_symlink_outside(store: Path, suite: Suite, tmp_path: Path) -> None:
    outside = tmp_path / "outside.safetensors"
    shutil.move(store / "ctx-000002.safetensors", outside)
    os.symlink(outside, store / "ctx-000002.safetensors")
    with pytest.raises(VerificationError, match=r"ctx-000002.safetensors: symlink leaves the store folder"):
        CaptureStore.open(store, suite)


def test_flipped_byte(store: Path, suite: Suite) -> None:
    p = store / "ctx-000003.safetensors"
    data = bytearray(p.read_bytes())
    data[-5] ^= 0x01
    p.write_bytes(bytes(data))
    s = CaptureStore.open(store, suite)
    with pytest.raises(VerificationError, match=r"ctx-000003.safetensors: sha256: expected [0-9a-f]{64}, found [0-9a-f]{64}"):
        s.load(3)
    with pytest.raises(VerificationError, match="ctx-000003"):
        s.verify_all()


def test_truncated(store: Path, suite: Suite) -> None:
    p = store / "ctx-000000.safetensors"
    p.write_bytes(p.read_bytes()[:100])
    doc = _manifest(store)
    doc["files"][p.name]["sha256"] = sha256_file(p)
    _save_manifest(store, doc)
    with pytest.raises(VerificationError, match=r"ctx-000000.safetensors: corrupt or truncated safetensors"):
        CaptureStore.open(store, suite).load(0)


def test_nan(store: Path, suite: Suite) -> None:
    t = _rows(suite, 0)
    t[3, 1] = float("nan")
    _replace_file(store, 0, {"hidden_states": t})
    with pytest.raises(VerificationError, match=r"ctx-000000.safetensors: hidden_states values: expected all finite, found 1 NaN/Inf"):
        CaptureStore.open(store, suite).load(0)


def test_wrong_dtype_shape_name(store: Path, suite: Suite) -> None:
    _replace_file(store, 1, {"hidden_states": _rows(suite, 1).float()})
    with pytest.raises(VerificationError, match=r"ctx-000001.safetensors: hidden_states dtype: expected torch.bfloat16, found torch.float32"):
        CaptureStore.open(store, suite).load(1)
    _replace_file(store, 1, {"hidden_states": _rows(suite, 1)[:-1]})
    with pytest.raises(VerificationError, match=r"ctx-000001.safetensors: hidden_states shape: expected \[31, 8\], found \[30, 8\]"):
        CaptureStore.open(store, suite).load(1)
    _replace_file(store, 1, {"logits": _rows(suite, 1)})
    with pytest.raises(VerificationError, match=r"ctx-000001.safetensors: tensor names: expected \['hidden_states'\], found \['logits'\]"):
        CaptureStore.open(store, suite).load(1)


def test_writer_refuses_other_model_or_suite(store: Path, suite: Suite, tmp_path: Path, tiny_corpus: Path, tiny_tokenizer: Path) -> None:
    with pytest.raises(VerificationError, match=r"capture.json: existing store's model differs.*use a new --out folder"):
        with _writer(store, suite, model={**MODEL, "name": "other"}):
            pass
    from harness.inputs.suite import build_suite

    other = build_suite(tiny_corpus, tiny_tokenizer, 32, 6, 3, seed=99, out=tmp_path / "other")
    with pytest.raises(VerificationError, match=r"capture.json: existing store's suite_token_sha256 differs"):
        with _writer(store, other):
            pass


def test_writer_rejects_bad_tensors(tmp_path: Path, suite: Suite) -> None:
    t = _rows(suite, 0)
    t[0, 0] = float("inf")
    with _writer(tmp_path / "s", suite) as w:
        with pytest.raises(VerificationError, match="ctx-000000.safetensors: hidden_states values"):
            w.write(0, t)
        with pytest.raises(VerificationError, match="shape"):
            w.write(0, _rows(suite, 0)[:3])
    with pytest.raises(FidelityError, match="dtype 'float32' not allowed for a hidden_states store"):
        StoreWriter(tmp_path / "s", suite, "hidden_states", HIDDEN, "float32", MODEL, ENGINE, {}, "cpu")


def test_writer_resume_and_leftovers(store: Path, suite: Suite) -> None:
    (store / "ctx-000002.safetensors").unlink()  # listed but missing -> recaptured
    p = store / "ctx-000004.safetensors"
    p.write_bytes(p.read_bytes()[:-1])  # listed but corrupt -> recaptured
    doc = _manifest(store)
    del doc["files"]["ctx-000005.safetensors"]  # written but not yet listed (killed in between)
    _save_manifest(store, doc)
    with _writer(store, suite) as w:
        assert not (store / "ctx-000005.safetensors").exists()  # leftover removed on open
        assert [i for i in range(6) if not w.done(i)] == [2, 4, 5]
        for i in (2, 4, 5):
            w.write(i, _rows(suite, i))
    s = CaptureStore.open(store, suite)
    assert s.verify_all() == 6
