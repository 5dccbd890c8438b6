"""Hand-overs between pytest-xdist workers: bound to what they describe, never believed when planted
(unit cases and a real ``-n 2`` run); only the session's own files are removed.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.errors import VerificationError

# ----------------------------------------------------------------------------- 2. hand-overs bound to what they describe


KEY = b"k" * 32


def _positions(kld: float | None = None, seed: int = 0) -> Any:
    from harness.metrics import ContextLabel
    from harness.metrics.scores import PositionScores
    from harness.run.shard import ShardPositions

    rng = np.random.default_rng(seed)
    n = 6
    scores = PositionScores(
        kld=np.full(n, kld) if kld is not None else rng.random(n) + 0.1, jsd_bits=rng.random(n), ear=rng.random(n),
        nll_ref=rng.random(n), nll_cand=rng.random(n), argmax_ref=rng.integers(0, 9, n), argmax_cand=rng.integers(0, 9, n),
        kld_rev=rng.random(n), entropy_ref=rng.random(n), p_ref_top=rng.random(n), q_ref_top=rng.random(n),
        top5_overlap=rng.integers(0, 6, n), top10_overlap=rng.integers(0, 11, n),
    )
    return ShardPositions(scores=scores, context_index=np.repeat(np.arange(2), 3), row=np.tile(np.arange(3), 2),
                          labels=[ContextLabel(0, "d0", "prose"), ContextLabel(1, "d1", "prose")],
                          mode="hidden_states", head_sha256="ab" * 32, cand_head_sha256=None)


BOUND = {"session": "abc", "candidate": "good", "candidate_store_sha256": "1" * 64, "shard": 0, "window": 0}


class _Opener:
    """Unpickling this creates a file (a pickled hand-over must never be unpickled)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.marker, "w"))


def _plant(folder: Path, kind: str) -> None:
    from harness.run.shared_scores import save_positions

    target = folder / "good-shard00.npz"
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "planted":  # a forged file of the right shape, KLD 0, signed with another key
        save_positions(target, _positions(kld=0.0), BOUND, b"x" * 32)
    elif kind == "stale":  # this session's key, computed from another store (a candidate pointed elsewhere)
        save_positions(target, _positions(kld=0.0), {**BOUND, "candidate_store_sha256": "2" * 64}, KEY)
    elif kind == "renamed":  # this session's own file of another shard, renamed
        save_positions(folder / "good-shard01.npz", _positions(kld=0.0), {**BOUND, "shard": 1}, KEY)
        os.replace(folder / "good-shard01.npz", target)
    elif kind == "truncated":
        save_positions(target, _positions(kld=0.0), BOUND, KEY)
        target.write_bytes(target.read_bytes()[:200])
    elif kind == "pickled":  # every array present, the meta an object array whose unpickling opens a file
        save_positions(target, _positions(kld=0.0), BOUND, KEY)
        with np.load(target) as z:
            arrays = {k: z[k] for k in z.files}
        np.savez(target, **{**arrays, "meta": np.array([_Opener(str(folder / "UNPICKLED"))], dtype=object)})
    elif kind == "unsigned":  # the earlier format: no signature, no binding
        np.savez(target, meta=np.array(json.dumps({"schema": "fidelity.shared-positions/1"})), kld=np.zeros(6))


@pytest.mark.parametrize("kind", ["planted", "stale", "renamed", "truncated", "pickled", "unsigned"])
def test_handover_file_is_never_believed(tmp_path: Path, kind: str) -> None:
    """A hand-over file that this session did not compute from exactly these inputs is scored again and
    replaced: the numbers returned are the scorer's, never the file's (KLD 0 planted); nothing is unpickled."""
    from harness.run.shared_scores import Handover, load_positions, scored_once

    folder = tmp_path / "scored" / "abc"
    _plant(folder, kind)
    calls = []
    real = _positions(seed=7)

    def score() -> Any:
        calls.append(1)
        return real

    got = scored_once(Handover(folder=folder, session="abc", key=KEY), "good", 0, BOUND, score)
    assert calls == [1], "the planted file was believed"
    assert np.array_equal(got.scores.kld, real.scores.kld) and got.scores.kld.min() > 0
    assert not (folder / "UNPICKLED").exists()
    again = load_positions(folder / "good-shard00.npz", BOUND, KEY)  # replaced by the scored positions
    assert np.array_equal(again.scores.kld, real.scores.kld)


def test_handover_load_names_what_differs(tmp_path: Path) -> None:
    """Read directly, each forged file is a VerificationError naming the file and what differs."""
    from harness.run.shared_scores import load_positions

    folder = tmp_path / "f"
    for kind, pattern in [("planted", r"signature: expected signed by this session"),
                          ("stale", r"computed from \(candidate_store_sha256\): expected \{'candidate_store_sha256': '1111"),
                          ("renamed", r"computed from \(shard\): expected \{'shard': 0\}, found \{'shard': 1\}"),
                          ("truncated", r"shared positions: expected a \.npz of plain arrays"),
                          ("pickled", r"shared positions: expected a \.npz of plain arrays, found ValueError"),
                          ("unsigned", r"expected arrays .*signature")]:
        _plant(folder, kind)
        with pytest.raises(VerificationError, match=r"good-shard00\.npz: shared positions.*" if kind != "stale" else "good-shard00"):
            load_positions(folder / "good-shard00.npz", BOUND, KEY)
        with pytest.raises(VerificationError, match=pattern):
            load_positions(folder / "good-shard00.npz", BOUND, KEY)
        shutil.rmtree(folder)
    assert not (folder / "UNPICKLED").exists()


def test_end_of_session_removes_only_its_own_handover_files(tmp_path: Path) -> None:
    """The controller removes the files signed with its session's key (and their locks); a planted file and
    a user's file stay, and a folder it did not create stays."""
    from harness.run.shared_scores import remove_session_files, save_positions

    folder = tmp_path / "scored" / "abc"
    folder.mkdir(parents=True)
    save_positions(folder / "good-shard00.npz", _positions(), BOUND, KEY)
    (folder / "good-shard00.lock").write_bytes(b"")
    save_positions(folder / "bad-shard00.npz", _positions(), BOUND, b"other session")
    (folder / "notes.txt").write_text("mine")
    left = remove_session_files(folder, KEY, remove_folder=False)
    assert sorted(p.name for p in folder.iterdir()) == ["bad-shard00.npz", "notes.txt"]
    assert [p.name for p in left] == ["bad-shard00.npz"]
    # a folder the session created goes once it is empty (staged files of a killed worker and locks go too)
    own = tmp_path / "scored" / "def"
    own.mkdir()
    save_positions(own / "good-shard01.npz", _positions(), BOUND, KEY)
    (own / ".good-shard02.npz.abcd1234.tmp").write_bytes(b"half")
    (own / "good-shard03.lock").write_bytes(b"")
    assert remove_session_files(own, KEY, remove_folder=True) == [] and not own.exists()
    # a symbolic link in place of the folder: nothing behind it is touched
    target = tmp_path / "elsewhere"
    target.mkdir()
    save_positions(target / "good-shard00.npz", _positions(), BOUND, KEY)
    link = tmp_path / "scored" / "ghi"
    link.symlink_to(target)
    remove_session_files(link, KEY, remove_folder=True)
    assert (target / "good-shard00.npz").exists()


def test_binding_follows_the_store_content(tmp_path: Path, fidelity_project: Path) -> None:
    """The binding of a hand-over names the content of the stores: another store (one context file
    differing) gives another binding, so a file computed from it is not believed."""
    from harness.capture.store import CaptureStore
    from harness.inputs.head import load_head
    from harness.inputs.suite import Suite
    from harness.run.shared_scores import binding

    suite = Suite.load(fidelity_project / "suite")
    ref = CaptureStore.open(fidelity_project / "reference", suite)
    head = load_head(fidelity_project / "lm_head.safetensors")
    kw: dict[str, Any] = dict(session="abc", candidate="good", suite=suite, shard=1, reference=ref, head=head,
                              cand_head=None, window=0, device="cpu")
    b1 = binding(cand_store=ref, **kw)
    other = CaptureStore.open(fidelity_project / "reference", suite)
    other.hashes = {**other.hashes, suite.shard_indices(1)[0]: "f" * 64}
    b2 = binding(cand_store=other, **kw)
    assert b1 != b2 and [k for k in b1 if b1[k] != b2[k]] == ["candidate_store_sha256"]
    assert binding(cand_store=ref, **{**kw, "shard": 2})["shard_sha256"] == suite.shard(2).sha256
    assert b1["scorer"]["device"] == "cpu" and b1["head_sha256"] == head.sha256
    assert pickle.loads(pickle.dumps(b1)) == b1  # plain data only




# ----------------------------------------------------------------------------- a planted hand-over, end to end

MARK = "PLANTED-7f3a"


def _numbers(doc: Any, where: str = "$") -> dict[str, float]:
    """Every number of a JSON document by its path (timings and paths of files left out)."""
    out: dict[str, float] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k not in ("timing", "created", "load_s", "score_s", "scorer_run", "source"):
                out.update(_numbers(v, f"{where}.{k}"))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.update(_numbers(v, f"{where}[{i}]"))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        out[where] = float(doc)
    return out


@pytest.mark.slow  # a real -n 2 run of the tiny project (two workers start torch), after the shared serial run
def test_xdist_run_never_believes_a_planted_handover(fidelity_run: Path, tmp_path: Path) -> None:
    """Before a ``pytest -n 2`` run with a known ``--testrunuid``, its hand-over folder is planted with: for every
    shard of ``good``, a forgery identical to what the workers compute -- the exact binding (session, identities,
    store contents, suite, shard, window, scorer, heads) -- but with KLD 0 and a marker, signed with another key
    (what a killed earlier session of the same id leaves); a truncated file for ``bad`` shard 0; for ``bad`` shard 1
    a symbolic link to a forged file outside. The run's reports equal the serial run's (``-n 0``) numbers, no
    report holds the marker, the linked file outside is untouched, and the run passes."""
    import dataclasses
    import os
    import subprocess
    import sys

    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession
    from harness.run.shared_scores import binding, load_positions, save_positions, shared_dir

    root = tmp_path / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    uid = "planted0run"
    config = load_config(root / "fidelity.toml")
    folder = shared_dir(config.cache_dir, uid)
    folder.mkdir(parents=True)
    session = FidelitySession(config=config)
    forged_key = b"k" * 32

    def forged(name: str, shard: int) -> tuple[Any, dict[str, Any]]:
        cand = config.candidate(name)
        pos, inputs = session.positions(cand, shard), session.shard_inputs(cand, shard)
        bound = binding(session=uid, candidate=name, suite=inputs.suite, shard=shard, reference=inputs.reference,
                        cand_store=inputs.candidate, head=inputs.head, cand_head=inputs.cand_head,
                        window=inputs.score_from, device=session.device)
        zero = np.zeros_like(pos.scores.kld)
        fake = dataclasses.replace(pos, scores=dataclasses.replace(pos.scores, kld=zero, kld_rev=zero, jsd_bits=zero),
                                   scorer_run={"planted": MARK})
        return fake, bound

    for shard in range(4):
        fake, bound = forged("good", shard)
        save_positions(folder / f"good-shard{shard:02d}.npz", fake, bound, forged_key)
        assert float(load_positions(folder / f"good-shard{shard:02d}.npz", bound, forged_key).scores.kld.max()) == 0.0
    fake, bound = forged("bad", 0)
    save_positions(folder / "bad-shard00.npz", fake, bound, forged_key)
    (folder / "bad-shard00.npz").write_bytes((folder / "bad-shard00.npz").read_bytes()[:300])
    victim = tmp_path / "outside" / "victim.npz"
    victim.parent.mkdir()
    fake, bound = forged("bad", 1)
    save_positions(victim, fake, bound, forged_key)
    victim_bytes = victim.read_bytes()
    os.symlink(victim, folder / "bad-shard01.npz")

    out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--testrunuid", uid, "-m", "fidelity or fidelity_tails", "--fidelity-report-dir", "par"],
                         cwd=root, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    serial, par = root / "reports", root / "par"
    compared = 0
    for name in ("good", "bad"):
        for shard in range(4):
            want = _numbers(json.loads((serial / name / f"shard-{shard:02d}.json").read_text())["metrics"])
            got = _numbers(json.loads((par / name / f"shard-{shard:02d}.json").read_text())["metrics"])
            assert got.keys() == want.keys()
            for k, v in want.items():
                assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-12), (name, shard, k)
            assert got["$.kld.mean"] > 0
            compared += len(want)
    want_t, got_t = (_numbers(json.loads((d / "tails.json").read_text())["candidates"]) for d in (serial, par))
    # (the serial run wrote the baselines as it ran, so its tails have no baseline p99 to compare with: compared where both have it)
    assert set(want_t) <= set(got_t) and all(got_t[k] == pytest.approx(v, rel=1e-5, abs=1e-12) for k, v in want_t.items())
    compared += len(want_t)
    assert compared > 500
    leaked = [p for p in par.rglob("*") if p.is_file() and MARK.encode() in p.read_bytes()]
    assert leaked == []
    assert victim.read_bytes() == victim_bytes
