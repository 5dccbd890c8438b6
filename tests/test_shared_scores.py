"""Scored positions handed over between pytest-xdist workers (harness/run/shared_scores.py)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from harness.errors import FidelityError, VerificationError
from harness.metrics import ContextLabel
from harness.metrics.scores import PositionScores
from harness.run.shard import ShardPositions
from harness.run.shared_scores import Handover, load_positions, save_positions, scored_once, shared_dir

KEY = bytes(range(32))
BOUND = {"session": "s1", "candidate": "int8", "shard": 2}


def _handover(folder: Path) -> Handover:
    return Handover(folder=folder, session="s1", key=KEY)


def _positions(n: int = 7, seed: int = 0) -> ShardPositions:
    rng = np.random.default_rng(seed)
    scores = PositionScores(
        kld=rng.random(n), jsd_bits=rng.random(n), ear=rng.random(n), nll_ref=rng.random(n), nll_cand=rng.random(n),
        argmax_ref=rng.integers(0, 50, n), argmax_cand=rng.integers(0, 50, n), kld_rev=rng.random(n),
        entropy_ref=rng.random(n), p_ref_top=rng.random(n), q_ref_top=rng.random(n), top5_overlap=rng.integers(0, 6, n),
        top10_overlap=rng.integers(0, 11, n),
    )
    return ShardPositions(scores=scores, context_index=np.repeat(np.arange(2), [3, n - 3]), row=np.arange(n),
                          labels=[ContextLabel(4, "doc-a", "prose"), ContextLabel(9, "doc-b", "code")],
                          mode="hidden_states", head_sha256="ab" * 32, cand_head_sha256=None,
                          load_s=0.25, score_s=1.5, scorer_run={"backend": "torch", "gemm": "fp32"})


def test_round_trip_is_exact(tmp_path: Path) -> None:
    pos = _positions()
    save_positions(tmp_path / "x.npz", pos, BOUND, KEY)
    got = load_positions(tmp_path / "x.npz", BOUND, KEY)
    for f in ("kld", "jsd_bits", "ear", "nll_ref", "nll_cand", "argmax_ref", "argmax_cand"):
        a, b = getattr(pos.scores, f), getattr(got.scores, f)
        assert a.dtype == b.dtype and np.array_equal(a, b), f
    assert np.array_equal(got.context_index, pos.context_index) and np.array_equal(got.row, pos.row)
    assert got.labels == pos.labels
    assert (got.mode, got.head_sha256, got.cand_head_sha256, got.load_s, got.score_s, got.scorer_run) == \
        (pos.mode, pos.head_sha256, pos.cand_head_sha256, pos.load_s, pos.score_s, pos.scorer_run)


def test_second_call_reads_instead_of_scoring(tmp_path: Path) -> None:
    calls: list[int] = []

    def score() -> ShardPositions:
        calls.append(1)
        return _positions(seed=3)

    first = scored_once(_handover(tmp_path / "s"), "int8", 2, BOUND, score)
    second = scored_once(_handover(tmp_path / "s"), "int8", 2, BOUND, score)
    other = scored_once(_handover(tmp_path / "s"), "int8", 3, {**BOUND, "shard": 3}, score)  # scored on its own
    assert len(calls) == 2
    assert np.array_equal(first.scores.kld, second.scores.kld) and np.array_equal(other.scores.kld, first.scores.kld)
    assert sorted(p.name for p in (tmp_path / "s").glob("*.npz")) == ["int8-shard02.npz", "int8-shard03.npz"]


def _worker(folder: str, counter: str, out: str) -> None:
    import time

    def score() -> ShardPositions:
        with open(counter, "a") as fh:
            fh.write("x")
        time.sleep(0.3)  # the other process arrives while this one scores
        return _positions(seed=5)

    pos = scored_once(_handover(Path(folder)), "cand", 0, BOUND, score)
    np.save(out, pos.scores.kld)


def test_two_processes_score_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers asking for the same shard at the same time: one scores, the other waits and reads."""
    # A spawned child imports this module by its name ("tests.test_shared_scores", pytest's importlib mode) from
    # the parent's sys.path, which holds the repository root only under `python -m pytest`: put it there for
    # plain `pytest` too.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(str(tmp_path / "s"), str(tmp_path / "count"), str(tmp_path / f"out{i}.npy")))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert (tmp_path / "count").read_text() == "x"
    assert np.array_equal(np.load(tmp_path / "out0.npy"), np.load(tmp_path / "out1.npy"))


def test_refuses_a_foreign_file(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", kld=np.zeros(3))
    with pytest.raises(VerificationError, match=r"a\.npz: shared positions: expected arrays .*meta"):
        load_positions(tmp_path / "a.npz", BOUND, KEY)
    pos = _positions()
    save_positions(tmp_path / "b.npz", pos, BOUND, KEY)
    with np.load(tmp_path / "b.npz") as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(tmp_path / "c.npz", **{**arrays, "row": arrays["row"][:-1]})
    with pytest.raises(VerificationError, match=r"c\.npz: shared positions signature: expected signed by this session"):
        load_positions(tmp_path / "c.npz", BOUND, KEY)
    with pytest.raises(VerificationError, match=r"b\.npz: shared positions signature"):
        load_positions(tmp_path / "b.npz", BOUND, b"another session's key")
    with pytest.raises(VerificationError, match=r"b\.npz: shared positions computed from \(shard\): "
                                                r"expected \{'shard': 3\}, found \{'shard': 2\}"):
        load_positions(tmp_path / "b.npz", {**BOUND, "shard": 3}, KEY)


def test_shared_dir_names_the_session(tmp_path: Path) -> None:
    assert shared_dir(tmp_path, "0123abcd") == tmp_path / "scored" / "0123abcd"
    with pytest.raises(FidelityError, match="testrunuid"):
        shared_dir(tmp_path, "../escape")
