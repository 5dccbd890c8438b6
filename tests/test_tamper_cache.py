"""The capture cache is keyed by everything that changes the numbers (the runtime, the engines' numeric
settings): a setting that changes numbers gets its own capture, never another's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.errors import VerificationError

# ----------------------------------------------------------------------------- 3. a cache that never blocks a run


def test_capture_cache_is_keyed_by_the_runtime(tmp_path: Path, fidelity_project: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Another environment sharing the cache (another transformers or numpy version) gets a store of its
    own; a cached store that cannot be used is named with what to do in pytest (remove the cache folder),
    never with the command line's ``--out``."""
    from harness.capture.cache_sign import load_key, sign
    from harness.engines import identity
    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession

    shutil.copytree(fidelity_project, tmp_path / "p", symlinks=True)
    session = FidelitySession(config=load_config(tmp_path / "p" / "fidelity.toml"))
    good = session.config.candidate("good")
    here = session.live_store_path(good)
    real = identity.runtime_identity
    monkeypatch.setattr(identity, "runtime_identity", lambda: {**real(), "transformers": "0.0.other"})
    other = session.live_store_path(good)
    monkeypatch.setattr(identity, "runtime_identity", lambda: {**real(), "numpy": "0.0.other"})
    assert len({here, other, session.live_store_path(good)}) == 3 and other.parent == here.parent
    monkeypatch.setattr(identity, "runtime_identity", real)
    shutil.copytree(tmp_path / "p" / "reference", here)  # a store of another model where good's cache belongs,
    monkeypatch.setenv("FIDELITY_CACHE_KEY", str(tmp_path / "key" / "cache-key"))  # signed as the harness signs it
    (here / "capture.json").write_text(json.dumps(sign(json.loads((here / "capture.json").read_text()), load_key())))
    with pytest.raises(VerificationError, match=r"capture\.json: model \(the cached capture's model identity\): .*the capture cache of "
                                                r"candidate 'good' cannot be used: remove the folder .* and run pytest again") as e:
        session.candidate_store(good, 0)
    assert "--out" not in str(e.value)




# ----------------------------------------------------------------------------- settings that change numbers


def test_a_setting_that_changes_numbers_gets_its_own_capture(tmp_path: Path, fidelity_project: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            session_captures: list[Path]) -> None:
    """A live candidate captured under one setting is captured again (into another cache folder, the first
    untouched) when a kernel/ISA variable torch reads changes, and reused when a variable that does not change
    numbers (a vLLM memory size, for a transformers candidate) changes -- each run a new session, as a rerun is."""
    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession

    shutil.copytree(fidelity_project, tmp_path / "p", symlinks=True)
    captured = session_captures
    for var in ("ATEN_CPU_CAPABILITY", "VLLM_CPU_KVCACHE_SPACE", "FIDELITY_UNRELATED"):
        monkeypatch.delenv(var, raising=False)

    def run() -> Path:
        s = FidelitySession(config=load_config(tmp_path / "p" / "fidelity.toml"))
        good = s.config.candidate("good")
        store = s.candidate_store(good, 0)
        assert store.root == s.live_store_path(good)
        return Path(store.root)

    first = run()
    files = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    assert captured == [first]
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "7")  # memory of another engine: not a number of this one
    monkeypatch.setenv("FIDELITY_UNRELATED", "1")
    assert run() == first and captured == [first]  # reused, not captured again
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # read when torch starts: a capture under it is another capture
    second = run()
    assert second != first and second.parent == first.parent and captured == [first, second]
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == files  # the first store untouched
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert run() == first and len(captured) == 2


@pytest.mark.parametrize("engine, changes, same", [
    ("vllm", {"VLLM_CPU_ATTN_SPLIT_KV": "0"}, {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}),
    ("vllm", {"VLLM_CPU_INT4_W4A8": "0"}, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}),
    ("transformers", {"ONEDNN_DEFAULT_FPMATH_MODE": "BF16"}, {"OMP_NUM_THREADS": "3", "VLLM_CPU_ATTN_SPLIT_KV": "0"}),
    ("llamacpp", {"GGML_CPU_TILED_MM": "0"}, {"GGML_TOTAL_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx2"}),
])
def test_numeric_settings_by_engine(engine: str, changes: dict[str, str], same: dict[str, str]) -> None:
    from harness.engines.identity import identity_key
    from harness.engines.numeric_env import numeric_settings

    base = identity_key(numeric_settings(engine, {}))
    assert identity_key(numeric_settings(engine, changes)) != base
    assert identity_key(numeric_settings(engine, same)) == base


def test_vllm_settings_are_variables_the_installed_vllm_reads() -> None:
    """Every vLLM variable keyed is one the installed vLLM's ``envs.py`` declares (the list is not stale)."""
    pytest.importorskip("vllm")
    import vllm.envs

    from harness.engines.numeric_env import VLLM_ENV

    assert [k for k in VLLM_ENV if k not in vllm.envs.environment_variables] == []


def test_handover_binding_holds_the_scoring_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positions scored under another scoring path (``FIDELITY_GEMM``, ``FIDELITY_SCORER_BACKEND``,
    ``FIDELITY_FUSED_BLOCKS``) are bound to it: a hand-over written under one is not believed under another."""
    from types import SimpleNamespace

    from harness.run.shared_scores import binding

    store = SimpleNamespace(identity={"name": "x"}, kind="hidden_states", dtype="bfloat16", width=8, hashes={0: "a"})
    suite = SimpleNamespace(shard_indices=lambda s: [0], suite_token_sha256="s", shard=lambda s: SimpleNamespace(sha256="h"))

    def bound() -> dict[str, Any]:
        return binding(session="x", candidate="good", suite=suite, shard=0, reference=store, cand_store=store,
                       head=None, cand_head=None, window=0, device="cpu")

    for var in ("FIDELITY_GEMM", "FIDELITY_SCORER_BACKEND", "FIDELITY_FUSED_BLOCKS", "FIDELITY_THREADS"):
        monkeypatch.delenv(var, raising=False)
    base = bound()
    monkeypatch.setenv("FIDELITY_THREADS", "1")  # reorders a reduction only
    assert bound() == base
    for var, value in (("FIDELITY_GEMM", "fp32"), ("FIDELITY_SCORER_BACKEND", "torch"), ("FIDELITY_FUSED_BLOCKS", "64")):
        monkeypatch.setenv(var, value)
        assert bound()["scorer"]["env"][var] == value and bound() != base
        monkeypatch.delenv(var)
