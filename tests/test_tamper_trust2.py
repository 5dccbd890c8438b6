"""Third tamper campaign: the harness never deletes, trusts or half-writes what is not its own.

Each case plants ONE hostile thing (a crafted report-folder ledger, a forged hand-over file, a foreign
file in a store) and checks that the run is refused or the thing is not believed, with a message that
names the file, and that nothing outside what the harness wrote is deleted.
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
from harness.io.hashing import sha256_file
from harness.plugin.report_dir import STAMP, check_ledger, remove_previous_summaries, write_stamp

# ----------------------------------------------------------------------------- 1. delete only what is yours


def _folder_with_ledger(tmp_path: Path) -> tuple[Path, Path]:
    """A report folder with one summary written by a run, and a victim file beside the folder."""
    rep = tmp_path / "rep"
    (rep / "paired").mkdir(parents=True)
    (rep / "ladder.md").write_text("ladder\n")
    (rep / "paired" / "a-vs-b.json").write_text("{}\n")
    write_stamp(rep, "0" * 64, tmp_path / "f.toml", [rep / "ladder.md", rep / "paired" / "a-vs-b.json"], "pytest",
                created=["paired"])
    victim = tmp_path / "victim" / "fidelity.toml"
    victim.parent.mkdir()
    victim.write_text("[suite]\n")
    return rep, victim


def _add_entry(rep: Path, rel: str, sha: str) -> None:
    doc = json.loads((rep / STAMP).read_text())
    doc["files"][rel] = {"sha256": sha, "run": doc["latest_run"]}
    (rep / STAMP).write_text(json.dumps(doc))


def _snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("entry", ["../victim/fidelity.toml", "ABSOLUTE", "paired/../../victim/fidelity.toml",
                                   "fidelity.toml", "./ladder.json", "paired//a-vs-b.md", "good/../ladder.json"])
def test_ledger_naming_anything_else_is_refused_and_nothing_deleted(tmp_path: Path, entry: str) -> None:
    """A ledger entry outside the folder (``..``, an absolute path) or of a name this project does not write
    is refused as tampered: the stamp and the entry are named, and nothing at all is deleted."""
    rep, victim = _folder_with_ledger(tmp_path)
    rel = str(victim) if entry == "ABSOLUTE" else entry
    if entry == "fidelity.toml":
        shutil.copy(victim, rep / "fidelity.toml")  # a user's file inside the folder, named with its true sha256
    _add_entry(rep, rel, sha256_file(victim))
    before = _snapshot(tmp_path)
    with pytest.raises(VerificationError, match=rf"{STAMP}: files\[.*\]: expected .*, found"):
        check_ledger(rep)
    with pytest.raises(VerificationError, match=rf"{STAMP}: files\["):
        remove_previous_summaries(rep)
    assert _snapshot(tmp_path) == before


def test_symlinked_subfolder_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    """``paired`` replaced by a symbolic link to another folder holding a file of the listed name and sha256:
    refused naming the link; the linked folder keeps its files."""
    rep, _victim = _folder_with_ledger(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(rep / "paired" / "a-vs-b.json", outside / "a-vs-b.json")
    (rep / "paired").rmdir()
    (rep / "paired").symlink_to(outside)
    before = _snapshot(outside)
    with pytest.raises(VerificationError, match=r"paired is a symbolic link"):
        remove_previous_summaries(rep)
    assert _snapshot(outside) == before and (rep / "ladder.md").exists()


def test_symlinked_summary_file_is_refused(tmp_path: Path) -> None:
    """A listed summary that is itself a symbolic link (to a file of the listed sha256) is refused."""
    rep, victim = _folder_with_ledger(tmp_path)
    (rep / "ladder.md").unlink()
    (rep / "ladder.md").symlink_to(victim)
    _add_entry(rep, "ladder.md", sha256_file(victim))
    with pytest.raises(VerificationError, match=r"ladder\.md is a symbolic link"):
        remove_previous_summaries(rep)
    assert victim.read_text() == "[suite]\n"


def test_folders_only_those_a_run_created(tmp_path: Path) -> None:
    """A folder is removed only when the ledger says a run created it and it is empty; a ledger naming any
    other folder is refused."""
    rep, _victim = _folder_with_ledger(tmp_path)
    assert remove_previous_summaries(rep) == []
    assert not (rep / "paired").exists() and not (rep / "ladder.md").exists()
    doc = json.loads((rep / STAMP).read_text())
    doc["folders"] = ["paired", ".."]
    (rep / STAMP).write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=r"folders: expected a list of paired, found \['paired', '\.\.'\]"):
        check_ledger(rep)
    # a user's own (empty) paired/ folder, not recorded as created by a run, stays
    rep2 = tmp_path / "rep2"
    (rep2 / "paired").mkdir(parents=True)
    (rep2 / "paired" / "x-vs-y.md").write_text("t")
    write_stamp(rep2, "0" * 64, tmp_path / "f.toml", [rep2 / "paired" / "x-vs-y.md"], "pytest", created=[])
    remove_previous_summaries(rep2)
    assert (rep2 / "paired").is_dir() and not (rep2 / "paired" / "x-vs-y.md").exists()


def test_pytest_run_refuses_a_tampered_report_folder(pytester: pytest.Pytester, fidelity_project: Path) -> None:
    """An ordinary ``pytest fidelity.toml`` into a downloaded report folder whose ledger names the run's own
    configuration (``../fidelity.toml``) is a usage error naming the stamp and the entry; the
    configuration is still there."""
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    from harness.inputs.suite import Suite

    rep = pytester.path / "fidelity-reports"
    rep.mkdir()
    toml = pytester.path / "fidelity.toml"
    write_stamp(rep, Suite.load(pytester.path / "suite").suite_token_sha256, toml, [], "pytest")
    _add_entry(rep, "../fidelity.toml", sha256_file(toml))
    before = _snapshot(pytester.path)
    result = pytester.runpytest("--collect-only", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{STAMP}: files[[]'../fidelity.toml'[]]: expected a path relative to the folder*"])
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()
    assert _snapshot(pytester.path) == before
    # a candidate's report folder that is a symbolic link is refused too (reports are never written through one)
    (rep / STAMP).unlink()
    (rep / "good").symlink_to(pytester.path / "models")
    result = pytester.runpytest("--collect-only", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fidelity-reports/good: report folder entry: expected a folder*found a symbolic link*"])


def test_store_never_deletes_a_foreign_unlisted_file(tmp_path: Path, tiny_suite: Path) -> None:
    """An unlisted ``ctx-*.safetensors`` in a store is removed on open only when it is this store's own
    interrupted write (its embedded identity names the context of this suite); a foreign file or a symbolic
    link of that name is refused, named, and kept (and the link's target untouched)."""
    import torch

    from harness.capture.store import StoreWriter
    from harness.engines.identity import runtime_identity
    from harness.inputs.suite import Suite

    suite = Suite.load(tiny_suite)

    def writer() -> StoreWriter:
        return StoreWriter(tmp_path / "s", suite, "hidden_states", 8, "bfloat16", {"name": "m"},
                           {"name": "e", "version": "1"}, runtime_identity(), "cpu")

    with writer() as w:
        w.write(0, torch.zeros(suite.n_ctx - 1, 8, dtype=torch.bfloat16))
    own = tmp_path / "s" / "ctx-000000.safetensors"
    shutil.copy(own, tmp_path / "s" / "ctx-000001.safetensors")  # index 0's content under index 1's name
    with pytest.raises(VerificationError, match=r"ctx-000001\.safetensors: unlisted file in the capture store: "
                                                r"expected a context file this store wrote, found \(0, "):
        with writer():
            pass
    assert (tmp_path / "s" / "ctx-000001.safetensors").exists()
    (tmp_path / "s" / "ctx-000001.safetensors").unlink()
    precious = tmp_path / "precious.bin"
    precious.write_bytes(b"mine")
    (tmp_path / "s" / "ctx-000002.safetensors").symlink_to(precious)
    with pytest.raises(VerificationError, match=r"ctx-000002\.safetensors: unlisted entry in the capture store"):
        with writer():
            pass
    assert precious.read_bytes() == b"mine"


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


# ----------------------------------------------------------------------------- 4. whole or not at all

_KILLER = r"""
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from harness.io import atomic
k = int(sys.argv[1])
calls = [0]
real = os.replace
def replace(src, dst):
    if calls[0] == k:
        os.kill(os.getpid(), signal.SIGKILL)
    calls[0] += 1
    real(src, dst)
atomic.os.replace = replace
folder = Path(sys.argv[2])
atomic.atomic_write_files({{folder / "shard-00.json": "new json", folder / "shard-00.md": "new md",
                           folder / "shard-00.txt": "new txt"}})
"""


@pytest.mark.parametrize("k", [0, 1, 2])
def test_kill_9_at_each_rename_is_completed_by_the_next_write(tmp_path: Path, k: int) -> None:
    """A process killed (SIGKILL) before the k-th rename of a three-file write leaves a journal; the next
    write into the folder (or a run's start on its report folder) completes the renames: all three files are
    the new ones, no staged file and no journal is left."""
    import subprocess
    import sys

    from harness.io.atomic import atomic_write_text

    folder = tmp_path / "rep" / "good"
    folder.mkdir(parents=True)
    for ext in ("json", "md", "txt"):
        (folder / f"shard-00.{ext}").write_text(f"old {ext}")
    script = tmp_path / "killer.py"
    script.write_text(_KILLER.format(root=str(Path(__file__).resolve().parents[1])))
    proc = subprocess.run([sys.executable, str(script), str(k), str(folder)], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    contents = {p.name: p.read_text() for p in folder.iterdir() if not p.name.startswith(".")}
    assert sum(v.startswith("new") for v in contents.values()) == k  # half-renamed: the kill landed
    assert [p.name for p in folder.glob(".fidelity-pending.*.json")]
    atomic_write_text(folder / "other.md", "x")  # the next write into the folder completes the set first
    assert {p.name: p.read_text() for p in folder.iterdir()} == {
        "shard-00.json": "new json", "shard-00.md": "new md", "shard-00.txt": "new txt", "other.md": "x"}


def test_report_folder_start_cleans_a_killed_runs_staged_files(tmp_path: Path) -> None:
    """Files a killed run staged and never renamed (``.<name>.<random>.tmp`` of a name the harness writes
    there) are removed when the next run starts; a user's file of that shape but another name stays."""
    from harness.plugin.report_dir import finish_interrupted_writes

    rep = tmp_path / "rep"
    (rep / "good").mkdir(parents=True)
    staged = [rep / "good" / ".shard-01.json.ab12cd34.tmp", rep / ".ladder.md.zz99yy88.tmp", rep / ".fidelity-run.json.a1b2c3d4.tmp"]
    for p in staged:
        p.write_text("half")
    mine = rep / ".notes.md.abcdefgh.tmp"
    mine.write_text("mine")
    assert sorted(finish_interrupted_writes(rep)) == sorted(staged)
    assert mine.exists() and not any(p.exists() for p in staged)


@pytest.mark.parametrize("pair", [["../x/.a.json.abcdefgh.tmp", "../x/a.json"], [".a.json.abcdefgh.tmp", "b.json"],
                                  ["sub/.a.json.abcdefgh.tmp", "a.json"], [".a.json.abcdefgh.tmp", "/etc/a.json"]])
def test_a_hostile_journal_renames_nothing(tmp_path: Path, pair: list[str]) -> None:
    """A journal that would rename outside its folder, onto another name or across folders is refused,
    named, and nothing is renamed."""
    from harness.io.atomic import finish_pending

    folder = tmp_path / "f"
    (folder / "sub").mkdir(parents=True)
    (tmp_path / "x").mkdir()
    for rel in (".a.json.abcdefgh.tmp", "sub/.a.json.abcdefgh.tmp"):
        (folder / rel).write_text("staged")
    (tmp_path / "x" / ".a.json.abcdefgh.tmp").write_text("staged")
    journal = folder / ".fidelity-pending.abcd1234.json"
    journal.write_text(json.dumps({"schema": "fidelity.pending-renames/1", "renames": [pair]}))
    before = _snapshot(tmp_path)
    with pytest.raises(VerificationError, match=r"\.fidelity-pending\.abcd1234\.json: renames\[0\]"):
        finish_pending(folder)
    assert _snapshot(tmp_path) == before


def test_kld_import_refused_midway_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``.kld`` whose last chunk decodes to NaN is refused after the suite and the first chunks were
    written: the command exits 1 naming the file and leaves no ``--out`` folder (and, into an existing
    empty folder, nothing inside it)."""
    import struct

    from harness.cli.main import main
    from harness.llamacpp.kld_file import write_kld

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, size=(3, 8))
    p = write_kld(tmp_path / "a.kld", tokens, 6, [rng.normal(size=(7, 6)).astype(np.float32) for _ in range(3)])
    data = bytearray(p.read_bytes())
    row = (4 + 6) * 2  # the last row of the last chunk: its float32 scale, then the quantized values
    data[len(data) - row : len(data) - row + 4] = struct.pack("<f", float("nan"))
    (tmp_path / "bad.kld").write_bytes(bytes(data))
    assert main(["kld", "import", str(tmp_path / "bad.kld"), "--out", str(tmp_path / "imp")]) == 1
    err = capsys.readouterr().err
    assert "ctx-000002.safetensors" in err and "Traceback" not in err
    assert not (tmp_path / "imp").exists()
    (tmp_path / "empty").mkdir()
    assert main(["kld", "import", str(tmp_path / "bad.kld"), "--out", str(tmp_path / "empty")]) == 1
    assert list((tmp_path / "empty").iterdir()) == []


def test_out_inside_an_input_is_refused_for_every_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An output path inside one of the command's inputs is refused before anything runs, whatever the
    command (here ``kld import`` into the folder holding its input, ``plan --out`` inside the reports)."""
    from harness.cli.main import main

    reports = tmp_path / "reports"
    (tmp_path / "suite").mkdir()
    (tmp_path / "model").mkdir()
    reports.mkdir()
    (reports / "x.kld").write_bytes(b"not read")
    before = _snapshot(tmp_path)
    assert main(["kld", "import", str(reports / "x.kld"), "--out", str(reports / "x.kld")]) == 2
    assert "kld --out output: it would overwrite or write inside its own input" in capsys.readouterr().err
    assert main(["capture", "--model", str(tmp_path / "model"), "--suite", str(tmp_path / "suite"),
                 "--out", str(tmp_path / "suite" / "store")]) == 2
    assert "capture --out output: it would overwrite or write inside its own input" in capsys.readouterr().err
    assert main(["plan", str(reports), "--candidate", "a", "--eps", "0.1", "--out", str(reports / "plan.json")]) == 2
    assert "plan --out output: it would overwrite or write inside its own input" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


def test_stats_json_never_holds_nan() -> None:
    """llama.cpp's block has values that are not estimable (a correlation of constant columns): in the JSON
    they are ``null``, and the file is strict JSON."""
    from harness.cli.kld import _not_estimable_as_null
    from harness.io.atomic import dumps_json
    from harness.io.jsonio import loads_json
    from harness.llamacpp.stats import LlamaPositions, compute_stats

    z = np.zeros(150, dtype=np.float32)
    stats = compute_stats(LlamaPositions(z + 1, z + 1, z.astype(np.float64), z, np.ones(150, bool)))
    assert np.isnan(stats["cor_ln_ppl"])
    with pytest.raises(ValueError, match="non-finite"):
        dumps_json({"llamacpp": stats})
    doc = loads_json(dumps_json(_not_estimable_as_null({"llamacpp": stats})), "s.json")
    assert doc["llamacpp"]["cor_ln_ppl"] is None and doc["llamacpp"]["dp_rms"] == [0.0, None]
    assert doc["llamacpp"]["kld_mean"] == [0.0, 0.0]


# ----------------------------------------------------------------------------- 5. the end of a session fails cleanly


@pytest.mark.parametrize("name, found", [("ladder.json", "the report folder's own 'ladder.json'"),
                                         ("Tails.png", "the report folder's own 'tails.png'"),
                                         ("paired", "the report folder's own 'paired'"),
                                         ("con", "a name Windows reserves for a device"),
                                         ("LPT1.q4", "a name Windows reserves for a device"),
                                         ("a" * 101, "101 bytes, at most 100")])
def test_candidate_names_are_portable_file_names(tmp_path: Path, fidelity_project: Path, name: str, found: str) -> None:
    """A candidate name that collides with a summary file, is a device name or too long for the files made
    from it is refused when the configuration loads, naming the file, the key and the name."""
    from harness.inputs.config import ConfigError, load_config

    shutil.copytree(fidelity_project, tmp_path / "p", symlinks=True)
    toml = tmp_path / "p" / "fidelity.toml"
    toml.write_text(toml.read_text().replace('name = "good"', f'name = "{name}"').replace('a = "good"', f'a = "{name}"'))
    with pytest.raises(ConfigError, match=rf"fidelity\.toml: candidates\[0\]\.name: expected a portable file name, "
                                          rf"found '{name}' \({found}\)"):
        load_config(toml)


def test_candidate_names_differing_only_in_case_are_refused(tmp_path: Path, fidelity_project: Path) -> None:
    from harness.inputs.config import ConfigError, load_config

    shutil.copytree(fidelity_project, tmp_path / "p", symlinks=True)
    toml = tmp_path / "p" / "fidelity.toml"
    toml.write_text(toml.read_text().replace('name = "good"', 'name = "Bad"').replace('a = "good"', 'a = "Bad"'))
    with pytest.raises(ConfigError, match=r"expected names that differ in more than letter case, found 'Bad' and 'bad'"):
        load_config(toml)


@pytest.mark.slow  # scores one shard of the tiny project
def test_a_write_failure_at_the_end_is_one_named_error(pytester: pytest.Pytester, fidelity_project: Path) -> None:
    """``ladder.json`` cannot be written at the end of the session (a folder stands in its place; a full
    disk or a read-only folder fail the same way): one named error, exit status 1, no INTERNALERROR, and no
    partial set of summaries (``ladder.md`` is not left without its ``ladder.json``)."""
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    pytester.runpytest("--fidelity-update-baselines", "-p", "no:cacheprovider", "-m", "fidelity", "-k", "good and shard00")
    rep = pytester.path / "fidelity-reports"
    (rep / "ladder.json").unlink()
    (rep / "ladder.md").unlink()
    (rep / "ladder.json").mkdir()  # a folder the ledger lists as the summary: kept, and the write fails
    (rep / "ladder.json" / "keep.txt").write_text("mine")
    result = pytester.runpytest("-p", "no:cacheprovider", "-m", "fidelity", "-k", "good and shard00")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 1 and "INTERNALERROR" not in out and "Traceback" not in out
    result.stdout.fnmatch_lines(["*the session's reports were not written*", "error: *ladder.json: cannot write: *"])
    assert not (rep / "ladder.md").exists() and (rep / "ladder.json" / "keep.txt").read_text() == "mine"
    assert (rep / "good" / "shard-00.json").exists()  # the shard report itself was written as it arrived


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


# ----------------------------------------------------------------------------- 7. identity in the gate


def _scored(identity: dict[str, Any], mean: float = 0.001) -> Any:
    from types import SimpleNamespace

    from harness.gate.baselines import Headline

    return SimpleNamespace(candidate="good", shard=0, headline=Headline(mean, mean / 2, mean * 2, mean * 5, 0.99),
                           report=SimpleNamespace(comparability={"candidate": {"name": "good", "identity": identity}}))


MODEL_A = {"name": "good", "config_sha256": "a" * 64, "weights": {"model.safetensors": "b" * 64}}
MODEL_B = {"name": "good", "config_sha256": "a" * 64, "weights": {"model.safetensors": "c" * 64}}


def test_baseline_records_the_identity_and_the_gate_checks_it(tmp_path: Path) -> None:
    """The baseline records the sha256 of the candidate's content identity (the folder name left out); a
    case of another model under the same name fails naming the file, the expected and the found identity,
    even when its numbers pass; the same model in another folder passes."""
    from harness.gate.baselines import Baseline, Headline, identity_sha256, write_baseline
    from harness.gate.gate import Gate

    head = Headline(0.001, 0.0005, 0.002, 0.005, 0.99)
    path = write_baseline(tmp_path, "good", {0: head}, MODEL_A)
    doc = json.loads(path.read_text())
    independent = __import__("hashlib").sha256(json.dumps(
        {"config_sha256": "a" * 64, "weights": {"model.safetensors": "b" * 64}}, sort_keys=True,
        separators=(",", ":")).encode()).hexdigest()
    assert doc["identity"] == {"sha256": independent, "model": "good"} == {"sha256": identity_sha256(MODEL_A), "model": "good"}
    gate = Gate(baselines=tmp_path, update=False, config_path=tmp_path / "fidelity.toml")
    assert gate.failure(_scored(MODEL_A)) is None
    assert gate.failure(_scored({**MODEL_A, "name": "moved-elsewhere"})) is None
    msg = gate.failure(_scored(MODEL_B))
    assert msg is not None and f"good.json: identity: expected {independent[:12]} (good), found " \
        f"{identity_sha256(MODEL_B)[:12]} (good): the candidate is another model" in msg
    assert "--fidelity-update-baselines" in msg
    # an update on purpose records the new identity and drops the other model's entries
    write_baseline(tmp_path, "good", {1: head}, MODEL_B)
    b = Baseline.load(path, "good")
    assert b.identity is not None and b.identity["sha256"] == identity_sha256(MODEL_B) and list(b.shards) == ["01"]


def test_baseline_without_identity_gates_and_a_malformed_identity_is_refused(tmp_path: Path) -> None:
    """A baseline written before identities were recorded still gates on its thresholds (the run names it);
    an identity that is not a sha256 is refused naming the file and the key."""
    from harness.gate.baselines import Baseline, BaselineError
    from harness.gate.gate import Gate

    (tmp_path / "good.json").write_text(json.dumps({"schema": "fidelity.baseline/1", "candidate": "good",
                                                    "default": {"max_mean_kld": 0.0005}}))
    msg = Gate(baselines=tmp_path, update=False, config_path=tmp_path / "f.toml").failure(_scored(MODEL_A))
    assert msg is not None and "mean_kld 0.001 > max 0.0005" in msg
    (tmp_path / "good.json").write_text(json.dumps({"schema": "fidelity.baseline/1", "candidate": "good",
                                                    "identity": {"sha256": "xyz"}, "default": {}}))
    with pytest.raises(BaselineError, match=r"good\.json: identity: expected \{sha256: 64 hex digits"):
        Baseline.load(tmp_path / "good.json", "good")


def test_two_candidates_of_one_identity_are_reported() -> None:
    """Two candidates that are one model by content through one engine are named; the same model through
    two engines is two measurements and is not."""
    from harness.plugin.ladder import same_identity_groups

    hf, vllm = {"name": "transformers"}, {"name": "vllm"}
    groups = same_identity_groups({
        "a": {"model": MODEL_A, "engine": hf}, "a_copy": {"model": {**MODEL_A, "name": "copy"}, "engine": hf},
        "a.vllm": {"model": MODEL_A, "engine": vllm}, "b": {"model": MODEL_B, "engine": hf}})
    assert groups == [["a", "a_copy"]]


# ----------------------------------------------------------------------------- 8. suite and plan honesty


def test_suite_with_a_duplicated_window_is_refused(tmp_path: Path, tiny_suite: Path) -> None:
    """A context that repeats another's window (same document, same start), resealed, fails verification
    naming both contexts: it would be scored and bootstrapped twice."""
    from harness.inputs.suite import Suite, manifest_sha256

    shutil.copytree(tiny_suite, tmp_path / "s")
    sj = tmp_path / "s" / "suite.json"
    doc = json.loads(sj.read_text())
    doc["contexts"][3]["document"] = doc["contexts"][2]["document"]
    doc["contexts"][3]["start_token"] = doc["contexts"][2]["start_token"]
    doc["manifest_sha256"] = manifest_sha256(doc)
    sj.write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=r"suite\.json: contexts\[3\] \(document, start_token\): expected each "
                                                r"window of a document once, found .* already contexts\[2\]"):
        Suite.load(tmp_path / "s")


def test_plan_search_never_reports_its_cap_as_the_answer() -> None:
    """A requirement beyond the search cap is None ("more than"), and one just below the cap is found exactly
    (checked against the closed form of the normal-approximation bound with a huge pilot spread)."""
    from harness.planning.design import MAX_CLUSTERS, ClusterPilot, _smallest, clusters_for_precision

    rng = np.random.default_rng(0)
    n = np.full(20, 100.0)
    p = ClusterPilot(sums=rng.normal(1.0, 50.0, 20) * 100.0 + 100.0, positions=n, contexts=np.ones(20))
    assert clusters_for_precision(p, 1e-300) is None
    assert _smallest(lambda c: c >= MAX_CLUSTERS - 3) == MAX_CLUSTERS - 3
    assert _smallest(lambda c: c >= MAX_CLUSTERS) == MAX_CLUSTERS
    assert _smallest(lambda c: c >= 9_000_001) == 9_000_001  # between the last doubling (8,388,608) and the cap


# ----------------------------------------------------------------------------- 6. one strict reader, one schema per file


def _tail(**over: Any) -> dict[str, Any]:
    """A tail report of the shape ``tails.json`` holds (numbers arbitrary: only the schema is read here)."""
    stats = {"n_positions": 4, "percentiles": {"p50": 0.1, "p90": 0.2, "p99": 0.3, "p99.9": 0.3}, "cvar1": 0.3, "max": 0.3,
             "exceedance": {"0.0001": 4}}
    rep = {"schema": "fidelity.tails/1", "candidate": "a", "score_from": 0, "shards": [{"shard": 0, **stats}],
           "cumulative": {**stats, "quantile_bounds": {k: [0.0, 1.0] for k in ("p50", "p90", "p99", "p99.9")},
                          "exceedance_histogram_bounds": {"0.0001": [4, 4]}},
           "ccdf": {"x": [1e-3], "y": [0.5]}}
    return {**rep, **over}


@pytest.mark.parametrize("doc, pattern", [
    ({"schema": "fidelity.tails/1", "candidates": "x"},
     r"tails\.json: candidates: expected an array of an object \{schema, candidate, .*\} \(no other key\), found a string 'x'"),
    ({"schema": "fidelity.tails/1", "candidates": [_tail(ccdf={"x": [1e-3], "y": ["0.5"]})]},
     r"tails\.json: candidates\[0\]\.ccdf\.y\[0\]: expected a finite number, found a string '0\.5'"),
    ({"schema": "fidelity.tails/1", "candidates": [{k: v for k, v in _tail().items() if k != "cumulative"}]},
     r"tails\.json: candidates\[0\]\.cumulative: expected present, found missing"),
])
def test_publish_refuses_a_lying_summary_by_name(tmp_path: Path, doc: Any, pattern: str) -> None:
    from harness.reports.report_set import TAILS_SCHEMA, _read_json

    (tmp_path / "tails.json").write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=pattern):
        _read_json(tmp_path / "tails.json", TAILS_SCHEMA)
    (tmp_path / "tails.json").write_bytes(b'{"candidates": "\xff"}')
    with pytest.raises(VerificationError, match=r"tails\.json: encoding: expected UTF-8 JSON"):
        _read_json(tmp_path / "tails.json", TAILS_SCHEMA)


def test_checksums_not_utf8_is_a_named_problem(tmp_path: Path) -> None:
    from harness.reports.report_set import verify_set

    (tmp_path / "checksums.txt").write_bytes(b"\xff\xfe not text")
    assert verify_set(tmp_path) == [f"{tmp_path / 'checksums.txt'}: encoding: expected UTF-8 text, found byte 0: invalid start byte"]


def test_shard_report_blocks_are_checked_by_schema(tmp_path: Path) -> None:
    """A shard report missing a block consumers add up (``metrics.totals.histogram``), or with a string where
    a count belongs, is refused naming the file and the dotted key (aggregate never meets a bare KeyError)."""
    from harness.io.schema import Nullable, Optional, check

    schema = {"totals": {"n": int, "histogram": {"counts": [int]}, "extra": Optional({"k": float})}, "ci": Nullable([float])}
    good = {"totals": {"n": 3, "histogram": {"counts": [1, 2]}}, "ci": None}
    check(good, schema, "r.json", "metrics")
    for bad, pattern in [({"totals": {"n": 3}, "ci": None}, r"r\.json: metrics\.totals\.histogram: expected present, found missing"),
                         ({"totals": {"n": True, "histogram": {"counts": []}}, "ci": None}, r"metrics\.totals\.n: expected an integer, found true/false True"),
                         ({"totals": {"n": 3, "histogram": {"counts": [1, "2"]}}, "ci": None}, r"histogram\.counts\[1\]: expected an integer, found a string '2'"),
                         ({**good, "totals": {**good["totals"], "extra": {"k": "nan"}}}, r"metrics\.totals\.extra\.k: expected a finite number"),
                         ({**good, "ci": [0.1, None]}, r"metrics\.ci\[1\]: expected a finite number, found null None")]:
        with pytest.raises(VerificationError, match=pattern):
            check(bad, schema, "r.json", "metrics")


_FIX = Path(__file__).resolve().parents[1] / "fixtures" / "candidates"


def _ct_copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(_FIX / name, dst)
    return dst


def _edit_weights(root: Path, edit: Any) -> None:
    from safetensors.torch import load_file, save_file

    for f in root.glob("*.safetensors"):
        tensors = load_file(f)
        edit(tensors)
        save_file(tensors, f, metadata={"format": "pt"})


@pytest.mark.parametrize("case, pattern", [
    ("num_bits", r"model\.safetensors: model\.layers\.0\.mlp\.down_proj\.weight_packed shape \(config\.json quantization_config"
                 r"\.config_groups\.group_0\.weights\.num_bits 3, weight_shape \[128, 384\]\): expected \[128, 36\], found \[128, 48\]"),
    ("weight_shape", r"q_proj\.weight_packed shape .*weight_shape \[128, 100\]\): expected \[128, 13\], found \[128, 16\]"),
    ("packed_dtype", r"down_proj\.weight_packed dtype \(config\.json .*pack-quantized\): expected I32, found I16"),
    ("group_size", r"down_proj\.weight_scale shape \(config\.json .*group, group_size 64\): expected \[128, 6\], found \[128, 12\]"),
    ("string_bits", r"config\.json: quantization_config\.config_groups\.group_0\.weights\.num_bits: expected an integer, found a string '4'"),
])
def test_compressed_tensors_config_that_lies_is_refused(tmp_path: Path, case: str, pattern: str) -> None:
    """compressed-tensors believes its configuration (a checkpoint saying 3 bits while packed 4 loads without a
    word and computes garbage): the harness checks it against the stored tensors first and names the file, the
    tensor, the expected and the found value; the untouched checkpoint loads."""
    import torch

    from harness.engines.transformers import load_model

    root = _ct_copy(tmp_path, "ct_w4a16_rtn")
    cfg = json.loads((root / "config.json").read_text())
    weights = cfg["quantization_config"]["config_groups"]["group_0"]["weights"]
    if case == "num_bits":
        weights["num_bits"] = 3
    elif case == "group_size":
        weights["group_size"] = 64
    elif case == "string_bits":
        weights["num_bits"] = "4"
    elif case == "weight_shape":
        _edit_weights(root, lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.weight_shape", torch.tensor([128, 100])))
    elif case == "packed_dtype":
        _edit_weights(root, lambda t: t.__setitem__("model.layers.0.mlp.down_proj.weight_packed",
                                                    t["model.layers.0.mlp.down_proj.weight_packed"].to(torch.int16)))
    (root / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VerificationError, match=pattern):
        load_model(root)


def test_compressed_tensors_fixtures_pass_the_check() -> None:
    """Every real compressed-tensors checkpoint of the fixtures (int4 packed, GPTQ, NVFP4, FP8) passes."""
    from harness.engines.compressed_config import check_compressed_tensors

    for name in ("ct_w4a16_rtn", "ct_w4a16_gptq", "ct_nv_fp4a16", "ct_fp8_dynamic"):
        check_compressed_tensors(_FIX / name)


def test_nvfp4_and_fp8_lies_are_refused(tmp_path: Path) -> None:
    from harness.engines.compressed_config import check_compressed_tensors

    root = _ct_copy(tmp_path, "ct_nv_fp4a16")
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32
    (root / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VerificationError, match=r"weight_scale shape \(config\.json .*group_size 32\): expected \[\d+, \d+\], found"):
        check_compressed_tensors(root)
    root = _ct_copy(tmp_path, "ct_fp8_dynamic")
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 4
    (root / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VerificationError, match=r"weight dtype \(config\.json .*num_bits 4, float-quantized\): "
                                                r"expected F8_E4M3 or F8_E5M2 with num_bits 8, found F8_E4M3 with num_bits 4"):
        check_compressed_tensors(root)
