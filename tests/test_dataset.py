"""End to end: build a dataset from the embedded default, move it, verify it, replay a candidate
there with the same numbers as inside the project; one flipped byte anywhere is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """In-project reports of int8 on shard 0 (capture + replay with the fixture's own paths), and a
    dataset built from them and moved to another folder."""
    tmp = tmp_path_factory.mktemp("ds")
    assert main(["capture", "--model", str(FIX / "candidates" / "int8"), "--suite", str(FIX / "suite"),
                 "--out", str(tmp / "cap" / "int8"), "--shards", "0", "--quiet"]) == 0
    assert main(["replay", "--suite", str(FIX / "suite"), "--reference", str(FIX / "reference"), "--candidate",
                 str(tmp / "cap" / "int8"), "--head", str(FIX / "lm_head.safetensors"), "--shards", "0",
                 "--name", "int8", "--reference-name", "bf16", "--out", str(tmp / "reports" / "int8")]) == 0
    assert main(["dataset", "build", "--config", str(ROOT / "fidelity.toml"), "--reports", str(tmp / "reports"),
                 "--corpus", str(FIX / "corpus"), "--tokenizer", str(FIX / "model" / "tokenizer.json"),
                 "--reference-shards", "0", "--out", str(tmp / "built")]) == 0
    moved = tmp / "elsewhere" / "dataset"
    moved.parent.mkdir()
    shutil.move(str(tmp / "built"), moved)
    return tmp, moved


def test_moved_dataset_verifies_and_replays_identically(built: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    tmp, ds = built
    assert main(["verify", str(ds)]) == 0
    assert "OK (dataset" in capsys.readouterr().out
    assert main(["replay", "--dataset", str(ds), "--candidate", str(FIX / "candidates" / "int8"), "--name", "int8",
                 "--out", str(tmp / "replayed")]) == 0
    mine = json.loads((tmp / "replayed" / "shard-00.json").read_text())
    ours = json.loads((tmp / "reports" / "int8" / "shard-00.json").read_text())
    assert mine["metrics"] == ours["metrics"]
    for key in ("suite_token_sha256", "shard", "score_from", "reference", "head_sha256", "scorer"):
        assert mine["comparability"][key] == ours["comparability"][key]
    assert mine["comparability"]["candidate"]["identity"] == ours["comparability"]["candidate"]["identity"]


def test_shard_without_reference_and_other_window_refused(built: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    tmp, ds = built
    assert main(["replay", "--dataset", str(ds), "--candidate", str(tmp / "cap" / "int8"), "--shards", "1",
                 "--out", str(tmp / "no")]) == 1
    assert "reference.shards (shards this dataset can replay): expected [0], found [1]" in capsys.readouterr().err
    assert main(["replay", "--dataset", str(ds), "--candidate", str(tmp / "cap" / "int8"), "--window", "3",
                 "--out", str(tmp / "no")]) == 1
    assert "score_from (the window of the dataset's reports): expected [0], found 3" in capsys.readouterr().err
    assert not (tmp / "no").exists()


@pytest.mark.parametrize("rel", ["dataset.json", "suite/tokens.npy", "shards/shard-02.npy", "reference/ctx-000003.safetensors",
                                 "head/lm_head.safetensors", "corpus/faq/design.txt", "reports/int8/shard-00.json",
                                 "PROTOCOL.md", "checksums.txt"])
def test_one_flipped_byte_is_refused(built: tuple[Path, Path], tmp_path: Path, rel: str, capsys: pytest.CaptureFixture[str]) -> None:
    _tmp, ds = built
    copy = tmp_path / "ds"
    shutil.copytree(ds, copy)
    p = copy / rel
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    assert main(["verify", str(copy)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fidelity: error: ") and "expected" in err


def test_replay_out_inside_the_dataset_is_refused(built: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """``--out`` inside the dataset would corrupt it (its verify would then fail): refused before anything
    is captured or written, and the dataset still verifies."""
    _tmp, ds = built
    assert main(["replay", "--dataset", str(ds), "--candidate", str(FIX / "candidates" / "int8"), "--name", "int8",
                 "--out", str(ds / "mine")]) == 2
    assert "replay --out output: it would overwrite or write inside its own input" in capsys.readouterr().err
    assert not (ds / "mine").exists()
    assert main(["verify", str(ds)]) == 0


def test_refused_replay_leaves_no_capture(built: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A replay of a model folder that is refused after its capture was made leaves nothing under ``--out``:
    no folder when there was none, and no ``capture/`` in a folder that existed."""
    tmp, ds = built
    args = ["replay", "--dataset", str(ds), "--candidate", str(FIX / "candidates" / "int8"), "--name", "bad name"]
    assert main([*args, "--out", str(tmp / "refused")]) == 2
    assert "--name: expected letters" in capsys.readouterr().err
    assert not (tmp / "refused").exists()
    (tmp / "existing").mkdir()
    (tmp / "existing" / "notes.md").write_text("mine")
    assert main([*args, "--out", str(tmp / "existing")]) == 2
    assert sorted(p.name for p in (tmp / "existing").iterdir()) == ["notes.md"]


def test_plan_says_more_than_its_cap_and_refuses_a_self_comparison(built: tuple[Path, Path], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``fidelity plan --eps 1e-300`` prints that more clusters than its search cap are needed (never the cap as
    the answer) and writes ``null`` with ``more_than_clusters``; a candidate planned against itself is refused."""
    from harness.planning.design import MAX_CLUSTERS

    tmp, _ds = built
    assert main(["plan", str(tmp / "reports"), "--candidate", "int8", "--eps", "1e-300", "--out", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert f"more than {MAX_CLUSTERS} clusters" in out and f": {MAX_CLUSTERS} clusters" not in out
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["precision"] == {"eps": 1e-300, "clusters": None, "contexts": None, "more_than_clusters": MAX_CLUSTERS}
    assert main(["plan", str(tmp / "reports"), "--candidate", "int8", "--versus", "int8", "--delta", "1e-4"]) == 2
    assert "expected another candidate than --candidate, found 'int8' twice" in capsys.readouterr().err


@pytest.mark.parametrize("edit, pattern", [
    (lambda d: d.pop("reference"), "dataset.json: reference: expected present, found missing"),
    (lambda d: d["reference"].update(shards=["0"]), "dataset.json: reference.shards[0]: expected an integer, found a string '0'"),
    (lambda d: d.update(candidates={"int8": "0"}), "dataset.json: candidates.int8: expected an array of an integer, found a string '0'"),
    (lambda d: d.update(score_from=None), "dataset.json: score_from: expected an array of an integer, found null None"),
])
def test_resealed_manifest_lies_are_named(built: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          edit: Any, pattern: str) -> None:
    """A dataset.json with a missing block or a string where a number belongs, resealed in checksums.txt, is a
    named refusal (file, key, expected, found), never a KeyError or TypeError."""
    from harness.reports.report_set import write_checksums

    _tmp, ds = built
    copy = tmp_path / "ds"
    shutil.copytree(ds, copy)
    doc = json.loads((copy / "dataset.json").read_text())
    edit(doc)
    (copy / "dataset.json").write_text(json.dumps(doc))
    write_checksums(copy)
    assert main(["verify", str(copy)]) == 1
    err = capsys.readouterr().err
    assert pattern in err and "Traceback" not in err, err
