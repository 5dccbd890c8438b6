"""Nothing done twice in a run: each weight file of a live candidate is hashed once, each capture
store is opened (and verified) once, each candidate x shard's inputs are built and joined once --
counted on the real fixture project, with a live quantized candidate scored on two shards."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.capture.store import CaptureStore
from harness.inputs.config import load_config
from harness.run import shard_inputs as shard_inputs_module
from harness.run.session import FidelitySession

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A fidelity.toml over the committed suite, reference and head, with one live quantized candidate
    (a copy of fixtures/candidates/int8, so its cache entry is this test's own)."""
    model = tmp_path / "int8"
    shutil.copytree(ROOT / "fixtures" / "candidates" / "int8", model)
    fx = ROOT / "fixtures"
    (tmp_path / "fidelity.toml").write_text(
        f'[suite]\npath = "{fx / "suite"}"\n\n'
        f'[reference]\nname = "bf16"\nmodel = "{fx / "model"}"\nstore = "{fx / "reference"}"\n'
        f'head = "{fx / "lm_head.safetensors"}"\n\n'
        f'[settings]\ncache_dir = "{tmp_path / "cache"}"\nbaselines = "{tmp_path / "baselines"}"\nn_boot = 200\n\n'
        f'[[candidates]]\nname = "int8"\nmodel = "{model}"\n'
    )
    return tmp_path


class Counts:
    """What the run did, counted at the bottom: file hashes by path, store opens by folder, joins by case."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hashed: Counter[Path] = Counter()
        self.opened: Counter[Path] = Counter()
        self.joined: Counter[tuple[str, int]] = Counter()
        digest, open_store, verified = hashlib.file_digest, CaptureStore.open.__func__, shard_inputs_module.verified  # type: ignore[attr-defined]

        def counting_digest(fh: Any, name: Any) -> Any:
            self.hashed[Path(fh.name).resolve()] += 1
            return digest(fh, name)

        def counting_open(cls: type[CaptureStore], root: Any, *args: Any, **kw: Any) -> CaptureStore:
            self.opened[Path(root).resolve()] += 1
            store: CaptureStore = open_store(cls, root, *args, **kw)
            return store

        def counting_verified(inputs: Any) -> Any:
            self.joined[(str(inputs.candidate.root), inputs.shard)] += 1
            return verified(inputs)

        monkeypatch.setattr(hashlib, "file_digest", counting_digest)
        monkeypatch.setattr(CaptureStore, "open", classmethod(counting_open))
        monkeypatch.setattr("harness.run.session.verified", counting_verified)


def _run(project: Path) -> FidelitySession:
    """One run: two shards of the live candidate, every case kind a run asks the session for."""
    session = FidelitySession(load_config(project / "fidelity.toml"))
    cand = session.config.candidate("int8")
    session.plan([("int8", 0), ("int8", 1)])
    for shard in (0, 1):
        session.score(cand, shard, n_boot=200)  # the shard case
        session.positions(cand, shard)  # tails, windows, pairs
        session.candidate_store(cand, shard)
        session.shard_inputs(cand, shard)
    return session


@pytest.mark.slow
def test_each_weight_file_is_hashed_once_per_run(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = Counts(monkeypatch)
    session = _run(project)
    model = (project / "int8").resolve()
    files = sorted(p.resolve() for p in model.iterdir())
    assert {p.name for p in files} >= {"config.json", "model.safetensors", "quantization.json"}
    assert {p.name: counts.hashed[p] for p in files} == {p.name: 1 for p in files}
    # the reference model is identified once too (its store's recorded identity is checked against it)
    ref_files = [p.resolve() for p in (ROOT / "fixtures" / "model").iterdir() if p.suffix in (".json", ".safetensors")]
    assert all(counts.hashed[p] <= 1 for p in ref_files), {p.name: counts.hashed[p] for p in ref_files}
    # the candidate's store: captured once for both planned shards, opened once
    live = session.live_store_path(session.config.candidate("int8")).resolve()
    assert counts.opened[live] == 1
    assert counts.opened[(ROOT / "fixtures" / "reference").resolve()] == 1
    assert sorted(counts.joined.values()) == [1, 1]
    # the inputs of a case: one frozen object, shared by every use of the case
    cand = session.config.candidate("int8")
    inputs = session.shard_inputs(cand, 0)
    assert session.shard_inputs(cand, 0) is inputs
    assert inputs.candidate is session.candidate_store(cand, 0) and inputs.reference is session.reference
    assert inputs.indices == list(session.suite.shard_indices(0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.shard = 1  # type: ignore[misc]

    # a second run (the capture now cached) identifies the candidate once more and opens its store once more
    counts2 = Counts(monkeypatch)
    _run(project)
    assert {p.name: counts2.hashed[p] for p in files} == {p.name: 1 for p in files}
    assert counts2.opened[live] == 1
