"""The capture cache is believed only when this user's harness signed it (harness.capture.cache_sign).

A stranger who can write the cache folder plants a store with the candidate's right identity and
self-consistent sha256s but made-up hidden states: it verifies by content, yet it is not believed -- the
candidate is captured again and its numbers are the real capture's. So is a store signed with another key.
A store this user's harness signed is reused. The key lives outside the cache, mode 0600, and a cluster
task uses the key its payload carries.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture()
def project(tmp_path: Path, fidelity_project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the tiny project, this user's key file in a folder of the test's own (outside the cache)."""
    shutil.copytree(fidelity_project, tmp_path / "p", symlinks=True)
    monkeypatch.setenv("FIDELITY_CACHE_KEY", str(tmp_path / "user" / "cache-key"))
    return tmp_path / "p"


def _session(project: Path) -> Any:
    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession

    return FidelitySession(config=load_config(project / "fidelity.toml"))


def _tensors(store: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return {p.name: load_file(p)["hidden_states"].float() for p in sorted(store.glob("ctx-*.safetensors"))}


def _forge(store: Path, key: bytes | None) -> None:
    """Replace every hidden state by made-up values, keeping the files' embedded identity, listing their new
    sha256s (a store consistent by content), dropping the signature (or signing with ``key``)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save

    from harness.capture.cache_sign import FIELD, sign

    mf = store / "capture.json"
    doc = json.loads(mf.read_text("utf-8"))
    for name in doc["files"]:
        with safe_open(str(store / name), framework="pt") as fh:
            meta = fh.metadata()
            t = fh.get_tensor("hidden_states")
        made_up = (torch.roll(t.float(), 1, dims=0) * 0.5 + 0.25).to(torch.bfloat16)
        data = save({"hidden_states": made_up}, metadata=meta)
        (store / name).write_bytes(data)
        doc["files"][name]["sha256"] = hashlib.sha256(data).hexdigest()
    doc.pop(FIELD)
    mf.write_text(json.dumps(sign(doc, key) if key is not None else doc), "utf-8")


def _assert_close(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch

    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0.02, atol=0.02), name


@pytest.mark.parametrize("forger_key", [None, b"k" * 32], ids=["unsigned", "another-key"])
def test_a_forged_cache_store_is_recaptured(project: Path, monkeypatch: pytest.MonkeyPatch, forger_key: bytes | None,
                                            session_captures: list[Path]) -> None:
    from harness.capture.cache_sign import FIELD, UntrustedCacheWarning
    from harness.capture.store import CaptureStore

    captured = session_captures
    s = _session(project)
    good = s.config.candidate("good")
    real_mean = s.score(good, 0).headline.mean_kld
    store = Path(s.candidate_store(good, 0).root)
    real = _tensors(store)
    assert captured == [store] and FIELD in json.loads((store / "capture.json").read_text("utf-8"))

    _forge(store, forger_key)
    forged = _tensors(store)
    planted = {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()}
    forged_store = CaptureStore.open(store, s.suite, verify=True)
    assert forged_store.verify_all() == len(forged) and forged_store.identity == s.candidate_identity(good)  # consistent
    assert all(float((forged[n] - real[n]).abs().max()) > 0.2 for n in real)  # and far from the real numbers

    s2 = _session(project)
    with pytest.warns(UntrustedCacheWarning, match=rf"{store}: cached capture of candidate 'good' not believed: .*moved to"):
        again = s2.candidate_store(good, 0)
    assert captured == [store, store]  # captured again, into the same cache folder
    aside = [p for p in store.parent.iterdir() if p.name.startswith(f".untrusted-{store.name}-")]
    assert len(aside) == 1 and {p.name: p.read_bytes() for p in aside[0].iterdir() if p.is_file()} == planted  # kept whole
    _assert_close(_tensors(store), real)  # the real capture's numbers, not the forgery's
    assert again.verify_all() == len(real)
    mean = s2.score(good, 0).headline.mean_kld
    assert mean == pytest.approx(real_mean, rel=0.02, abs=1e-6)
    # the recaptured store is signed: the next run believes it without capturing
    s3 = _session(project)
    assert Path(s3.candidate_store(good, 0).root) == store and len(captured) == 2


def test_a_signed_cache_store_is_reused_and_the_key_is_private_and_outside_the_cache(
        project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, session_captures: list[Path]) -> None:
    from harness.capture.cache_sign import key_path, load_key
    from harness.errors import FidelityError

    captured = session_captures
    for _ in range(2):
        s = _session(project)
        s.candidate_store(s.config.candidate("good"), 0)
    assert len(captured) == 1  # the second run reuses the signed store
    key = tmp_path / "user" / "cache-key"
    assert key_path() == key and key.is_file()
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600 and key.stat().st_size == 32
    assert not key.resolve().is_relative_to(s.config.cache_dir.resolve())
    assert load_key() == key.read_bytes()  # read back, not replaced
    # the default place: $XDG_CACHE_HOME/fidelity/cache-key
    monkeypatch.delenv("FIDELITY_CACHE_KEY")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert key_path() == tmp_path / "xdg" / "fidelity" / "cache-key"
    # a key inside the cache folder, or readable by others, is refused
    monkeypatch.setenv("FIDELITY_CACHE_KEY", str(s.config.cache_dir / "cache-key"))
    with pytest.raises(FidelityError, match="outside the cache folder"):
        load_key(s.config.cache_dir)
    monkeypatch.setenv("FIDELITY_CACHE_KEY", str(key))
    key.chmod(0o644)
    with pytest.raises(FidelityError, match="mode 0600, found .*0644"):
        load_key(s.config.cache_dir)


def test_a_cluster_task_signs_with_the_key_its_payload_carries(project: Path, tmp_path: Path) -> None:
    """A worker on another machine has no key file: it uses the driver's key from the task payload."""
    from harness.capture.cache_sign import unsigned_reason
    from harness.run.cluster import task as cluster_task
    from harness.run.cluster.task import TaskSpec, run_case

    config = (project / "fidelity.toml").resolve()
    driver_key = os.urandom(32)
    spec = TaskSpec(config=str(config), config_sha256=hashlib.sha256(config.read_bytes()).hexdigest(), device="cpu",
                    score_from=0, cache_key=driver_key)
    assert driver_key.hex() not in repr(spec)
    try:
        result = run_case(spec, "good", 0)
        assert "error" not in result, result.get("error")
        store = cluster_task._SESSIONS[spec].live_store_path(cluster_task._SESSIONS[spec].config.candidate("good"))
    finally:
        cluster_task._SESSIONS.pop(spec, None)
    doc = json.loads((store / "capture.json").read_text("utf-8"))
    assert unsigned_reason(doc, driver_key) is None
    assert not (tmp_path / "user" / "cache-key").exists()  # no key file was read or made on the worker


def test_the_writer_refuses_to_extend_a_cache_store_it_did_not_sign(project: Path, tmp_path: Path) -> None:
    """Below the session: a capture into a cache folder whose manifest is not signed with this user's key is
    refused, naming the manifest, and nothing there is deleted or changed."""
    from harness.capture.cache_sign import load_key
    from harness.capture.loop import capture
    from harness.errors import VerificationError

    s = _session(project)
    store = tmp_path / "cache-store"
    shutil.copytree(project / "reference", store)  # a verified store, unsigned
    before = {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()}
    with pytest.raises(VerificationError, match=r"capture\.json: cache signature: expected a manifest signed with this "
                                                r"user's cache key, found no cache signature"):
        capture("transformers", project / "models" / "reference", s.suite, store, shards=[0], progress=False,
                cache_key=load_key())
    assert {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()} == before
