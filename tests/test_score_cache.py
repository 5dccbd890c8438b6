"""Scored positions kept across runs (harness/run/score_cache.py, harness/run/result_cache.py): a second run of
an unchanged candidate x shard reads them; a changed store, window, scorer setting or CPU path is scored again,
never read; a forged entry is refused (scored again and replaced). Scoring is counted at the session's call of
:func:`harness.run.shard.shard_positions`; numbers are compared with a run that has no cache at all."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from harness.capture.cache_sign import UntrustedCacheWarning
from harness.errors import VerificationError
from harness.inputs.config import load_config
from harness.io.hashing import sha256_file
from harness.run import score_cache as score_cache_module
from harness.run import session as session_module
from harness.run.score_cache import FOLDER, score_binding
from harness.run.session import FidelitySession
from harness.run.shard import ShardPositions
from harness.run.shared_scores import save_positions


@pytest.fixture()
def project(fresh_project: Path) -> Path:
    """The tiny project with the reference store copied (so a test may change it) and no cache yet."""
    return fresh_project


@pytest.fixture()
def scored(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, int]]:
    """Every candidate store x shard a session of this test scores (not reads)."""
    calls: list[tuple[Path, int]] = []
    real = session_module.shard_positions

    def counting(inputs: Any, **kw: Any) -> ShardPositions:
        calls.append((inputs.candidate.root, inputs.shard))
        return real(inputs, **kw)

    monkeypatch.setattr(session_module, "shard_positions", counting)
    return calls


def _positions(project: Path, shard: int = 0, score_from: int = 0) -> tuple[FidelitySession, ShardPositions]:
    session = FidelitySession(load_config(project / "fidelity.toml"), score_from=score_from)
    return session, session.positions(session.config.candidate("good"), shard)


def _same(a: ShardPositions, b: ShardPositions) -> bool:
    return all(np.array_equal(getattr(a.scores, f), getattr(b.scores, f))
               for f in ("kld", "jsd_bits", "nll_ref", "nll_cand", "argmax_ref", "argmax_cand", "top10_overlap"))


def _entries(project: Path) -> list[Path]:
    return sorted((project / ".fidelity-cache" / FOLDER).glob("*.npz"))


def test_unchanged_rerun_reads_and_matches_an_uncached_run(project: Path, scored: list[tuple[Path, int]]) -> None:
    s1, first = _positions(project)
    assert len(scored) == 1 and not s1.reuse.served("scores", "good") and len(_entries(project)) == 1
    s2, second = _positions(project)
    assert len(scored) == 1, "an unchanged candidate x shard was scored again"
    assert s2.reuse.served("scores", "good") == {0}
    assert _same(first, second)
    report = s2.score(s2.config.candidate("good"), 0, n_boot=100).report
    assert report.timing["scores"] == "cache"
    # the same numbers as a run with the cache folder removed (independently scored)
    shutil.rmtree(project / ".fidelity-cache" / FOLDER)
    _, fresh = _positions(project)
    assert len(scored) == 2 and _same(fresh, second)
    assert s1.score(s1.config.candidate("good"), 0, n_boot=100).report.metrics == report.metrics


def test_a_changed_window_is_scored_again(project: Path, scored: list[tuple[Path, int]]) -> None:
    _positions(project)
    session, _ = _positions(project, score_from=8)
    assert len(scored) == 2 and not session.reuse.served("scores", "good") and len(_entries(project)) == 2


@pytest.mark.parametrize("setting", ["env", "cpu"])
def test_a_changed_scorer_setting_is_scored_again(project: Path, scored: list[tuple[Path, int]],
                                                  monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    _positions(project)
    if setting == "env":  # a scoring-path variable (another backend / GEMM path would round differently)
        monkeypatch.setenv("FIDELITY_SCORER_BACKEND", "torch")
    else:  # another CPU kind (torch dispatching for another instruction set)
        monkeypatch.setattr(score_cache_module, "cpu_capability", lambda: "AVX2-elsewhere")
    session, _ = _positions(project)
    assert len(scored) == 2 and not session.reuse.served("scores", "good")


def _edit_context(store: Path, index: int, scale: float) -> None:
    """Change one context of a store by hand, consistently (its manifest lists the new sha256): a changed store."""
    name = f"ctx-{index:06d}.safetensors"
    with safe_open(str(store / name), framework="pt") as fh:
        meta = fh.metadata()
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    save_file({k: (v.float() * scale).to(v.dtype).contiguous() for k, v in tensors.items()}, str(store / name), metadata=meta)
    doc = json.loads((store / "capture.json").read_text())
    doc["files"][name]["sha256"] = sha256_file(store / name)
    (store / "capture.json").write_text(json.dumps(doc))


def test_a_changed_store_is_scored_again(project: Path, scored: list[tuple[Path, int]]) -> None:
    session, before = _positions(project)
    first = session.shard_indices(0)[0]
    _edit_context(project / "reference", first, 1.5)
    session2, after = _positions(project)
    assert len(scored) == 2 and not session2.reuse.served("scores", "good")
    assert not np.array_equal(before.scores.kld, after.scores.kld)


def test_a_store_edited_behind_its_manifest_is_refused_not_read(project: Path, scored: list[tuple[Path, int]]) -> None:
    session, _ = _positions(project)
    name = f"ctx-{session.shard_indices(0)[0]:06d}.safetensors"
    manifest = (project / "reference" / "capture.json").read_text()
    _edit_context(project / "reference", session.shard_indices(0)[0], 1.5)
    (project / "reference" / "capture.json").write_text(manifest)  # the old sha256 again: the file no longer holds it
    with pytest.raises(VerificationError, match=name):
        _positions(project)


def test_a_forged_entry_is_refused_and_replaced(project: Path, scored: list[tuple[Path, int]]) -> None:
    session, true = _positions(project)
    inputs = session.shard_inputs(session.config.candidate("good"), 0)
    bound = score_binding(inputs, "good", session.device)
    (entry,) = _entries(project)
    fake = ShardPositions(**{**true.__dict__, "scores": type(true.scores)(**{
        **true.scores.__dict__, "kld": np.zeros_like(true.scores.kld)})})
    # the right binding and file name, signed with another key (or with none of this protocol's domain)
    for key, domain in ((b"k" * 32, f"{score_cache_module.PROTOCOL}\n".encode()), (session.signing_key(), b"")):
        save_positions(entry, fake, bound, key, domain=domain)
        with pytest.warns(UntrustedCacheWarning, match=entry.name):
            s, got = _positions(project)
        assert not s.reuse.served("scores", "good") and _same(got, true) and float(got.scores.kld.max()) > 0
    assert len(scored) == 3
    _, again = _positions(project)  # the replaced entry is this harness's own now
    assert len(scored) == 3 and _same(again, true)


def test_pytest_rerun_reads_every_shard_and_says_so(project: Path) -> None:
    """Through pytest: the second run's summary says what it reused; every metric block is unchanged."""
    def run(reports: str) -> tuple[str, dict[str, Any]]:
        out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "-p", "no:cacheprovider", "-m",
                              "fidelity", "--fidelity-update-baselines", "--fidelity-report-dir", reports],
                             cwd=project, capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        docs = {str(p.relative_to(project / reports)): json.loads(p.read_text())
                for p in (project / reports).rglob("*.json")}
        return out.stdout, {k: d["metrics"] for k, d in docs.items() if isinstance(d, dict) and "comparability" in d}

    cold_out, cold = run("r1")
    assert "score cache: reused 0 of 8 shards (bad 0 of 4, good 0 of 4)" in cold_out
    assert "fidelity: scores cache" in cold_out and "(0 entries;" in cold_out
    warm_out, warm = run("r2")
    assert "score cache: reused 8 of 8 shards (bad 4 of 4, good 4 of 4)" in warm_out, warm_out[-2000:]
    assert "(8 entries;" in warm_out
    assert len(cold) == 8 and warm == cold
