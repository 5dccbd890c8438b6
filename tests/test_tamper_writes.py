"""Writes that happen whole or not at all: a process killed at each rename is completed by the next
write, a hostile journal renames nothing, a refused command leaves nothing, ``--out`` never lands in an input.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.errors import VerificationError
from harness.io.hashing import sha256_file


def _snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in root.rglob("*") if p.is_file()}


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
    from harness.reports.report_dir import finish_interrupted_writes

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
