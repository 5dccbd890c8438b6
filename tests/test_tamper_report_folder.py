"""Report folders: every writer honours the folder's stamp and records what it wrote in its ledger.

Each command that writes into a folder (``fidelity precision-floor``, ``layers``, ``attribute``,
``allocate``, ``aggregate``, ``paired``, ``ladder``) opens it as the pytest run does
(harness/reports/report_folder.py): a folder stamped with another suite, or whose ledger was tampered
with, is refused before anything is computed, naming the stamp, the expected and the found value, and
nothing in the folder changes; what a command writes is listed in the ledger with its command line.
A crafted ledger never makes a run delete what is not its own, and a report folder that cannot be written
at the end of a session is one named error.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.errors import VerificationError
from harness.io.hashing import sha256_file
from harness.reports.report_dir import STAMP, check_ledger, remove_previous_summaries, write_stamp

OTHER = "e" * 64


def _suite_sha(project: Path) -> str:
    return str(json.loads((project / "suite" / "suite.json").read_text())["suite_token_sha256"])


def _snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in root.rglob("*") if p.is_file()}


def _stamped(folder: Path, suite_sha: str) -> Path:
    """A report folder a pytest run of the suite ``suite_sha`` stamped, holding its ladder."""
    folder.mkdir(parents=True)
    (folder / "ladder.md").write_text("ladder of another suite\n")
    write_stamp(folder, suite_sha, folder.parent / "fidelity.toml", [folder / "ladder.md"], "pytest fidelity.toml")
    return folder


def _argv(cmd: str, p: Path, out: Path) -> list[str]:
    """The command line of ``cmd`` on the tiny project ``p`` writing into ``out``."""
    models, suite = p / "models", str(p / "suite")
    pair = ["--reference", str(models / "reference"), "--candidate", str(models / "good"), "--suite", suite]
    return {
        "precision-floor": ["precision-floor", "--config", str(p / "fidelity.toml"), "--shards", "0", "--n-boot", "200"],
        "layers": ["layers", *pair, "--contexts", "1"],
        "attribute": ["attribute", *pair, "--shards", "0", "--n-boot", "200", "--quiet"],
        "allocate": ["allocate", "--reference", str(models / "reference"), "--suite", suite, "--base", "int4_g32",
                     "--budget", "int4_g32", "--quiet"],
        "aggregate": ["aggregate", str(p / "no-reports"), "--suite", suite, "--partial"],
        "paired": ["paired", str(p / "reference"), str(p / "reference"), "--suite", suite, "--reference",
                   str(p / "reference"), "--head", str(p / "lm_head.safetensors"), "--margin", "0.001",
                   "--name-a", "x", "--name-b", "y"],
        "ladder": ["ladder", str(p / "fidelity.toml")],
    }[cmd] + ["--out", str(out)]


COMMANDS = ["precision-floor", "layers", "attribute", "allocate", "aggregate", "paired", "ladder"]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_a_folder_stamped_with_another_suite_is_refused_by_every_writer(tmp_path: Path, fidelity_project: Path,
                                                                       cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before anything is computed: the message names the stamp, the expected suite (the command's)
    and the found one (the stamp's); exit 2; nothing in the folder changes; no traceback."""
    (fidelity_project / "no-reports").mkdir(exist_ok=True)
    out = _stamped(tmp_path / "reports", OTHER)
    before = _snapshot(out)
    capsys.readouterr()
    assert main(_argv(cmd, fidelity_project, out)) == 2
    err = capsys.readouterr().err
    assert (f"{out / STAMP}: the report folder holds reports of another suite: expected suite_token_sha256 "
            f"{_suite_sha(fidelity_project)}, found {OTHER}") in err, err
    assert "Traceback" not in err
    assert _snapshot(out) == before


@pytest.mark.parametrize("cmd", ["layers", "aggregate"])
def test_a_tampered_ledger_is_refused_by_a_command(tmp_path: Path, fidelity_project: Path, cmd: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger naming a file outside the folder is refused as the pytest run refuses it: the stamp and the
    entry named, the victim untouched."""
    (fidelity_project / "no-reports").mkdir(exist_ok=True)
    out = _stamped(tmp_path / "reports", _suite_sha(fidelity_project))
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    doc = json.loads((out / STAMP).read_text())
    doc["files"]["../victim.txt"] = {"sha256": sha256_file(victim), "run": doc["latest_run"]}
    (out / STAMP).write_text(json.dumps(doc))
    before = _snapshot(tmp_path)
    capsys.readouterr()
    assert main(_argv(cmd, fidelity_project, out)) == 2
    err = capsys.readouterr().err
    assert f"{out / STAMP}: files['../victim.txt']: expected a path relative to the folder" in err, err
    assert _snapshot(tmp_path) == before


def test_a_command_records_what_it_wrote_in_the_ledger(tmp_path: Path, fidelity_project: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``precision-floor --out`` into a folder of its suite: its two files are added to the ledger (sha256 of
    the bytes on disk, a run naming the command line), the earlier run's entry stays; into a new folder, the
    folder is stamped with the suite."""
    sha = _suite_sha(fidelity_project)
    out = _stamped(tmp_path / "reports", sha)
    argv = _argv("precision-floor", fidelity_project, out)
    assert main(argv) == 0, capsys.readouterr().err
    doc = check_ledger(out)
    assert doc is not None and doc["suite_token_sha256"] == sha
    files = doc["files"]
    assert set(files) == {"ladder.md", "precision_floor.json", "precision_floor.md"}
    for rel in ("precision_floor.json", "precision_floor.md"):
        assert files[rel]["sha256"] == sha256_file(out / rel)
        assert doc["runs"][files[rel]["run"]]["command"].startswith("fidelity precision-floor --config ")
    assert doc["runs"][files["ladder.md"]["run"]]["command"] == "pytest fidelity.toml"
    fresh = tmp_path / "fresh"
    assert main(_argv("precision-floor", fidelity_project, fresh)) == 0
    doc = check_ledger(fresh)
    assert doc is not None and doc["suite_token_sha256"] == sha
    assert set(doc["files"]) == {"precision_floor.json", "precision_floor.md"}


def test_commands_outputs_outlive_the_next_runs_summaries(tmp_path: Path) -> None:
    """A command's outputs in the ledger (layers, attribution, an aggregate) are the ledger's own names, and a
    later run's clean-up removes only the run summaries, never them; an edited one is kept and named."""
    rep = tmp_path / "rep"
    (rep / "int8").mkdir(parents=True)
    names = ["layers.json", "attribution.md", "int8/aggregate.json", "allocation.json", "ladder.md"]
    for rel in names:
        (rep / rel).write_text(rel + "\n")
    write_stamp(rep, "0" * 64, None, [rep / rel for rel in names], "fidelity layers", keep_summaries=True)
    assert set(check_ledger(rep)["files"]) == set(names)  # type: ignore[index]
    (rep / "attribution.md").write_text("edited\n")
    assert remove_previous_summaries(rep) == []
    assert sorted(p.relative_to(rep).as_posix() for p in rep.rglob("*") if p.is_file()) == sorted(
        [STAMP, *(n for n in names if n != "ladder.md")])


def test_published_pairs_without_a_suite_never_write_into_a_stamped_folder(tmp_path: Path, fidelity_project: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Published reports compared without ``--suite`` name no suite to check the stamp against: a stamped
    folder is refused (the stamp, what was expected and found named), nothing written."""
    out = _stamped(tmp_path / "reports", _suite_sha(fidelity_project))
    pub = tmp_path / "pub"
    pub.mkdir()
    doc = {"schema": "qwen38-fidelity-report/2"}
    for side in ("a", "b"):
        (pub / f"report-{side}.json").write_text(json.dumps(doc))
    before = _snapshot(out)
    capsys.readouterr()
    code = main(["paired", str(pub / "report-a.json"), str(pub / "report-b.json"), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{out / STAMP}: the report folder holds reports of suite_token_sha256" in err
    assert "expected a folder without a stamp or the suite to check it against (--suite)" in err
    assert _snapshot(out) == before
    shutil.rmtree(pub)


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


def _replay_argv(p: Path, store: Path, out: Path, name: str = "x") -> list[str]:
    """``fidelity replay`` of the candidate ``store`` against the tiny project's reference (shard 0) into ``out``."""
    return ["replay", "--suite", str(p / "suite"), "--reference", str(p / "reference"), "--candidate",
            str(store), "--head", str(p / "lm_head.safetensors"), "--shards", "0", "--n-boot", "200",
            "--name", name, "--out", str(out)]


def test_replay_into_a_report_folder_follows_its_rule(tmp_path: Path, fidelity_project: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``replay --out`` into a report folder (the folder it writes into or its parent is stamped): another
    suite's folder is refused naming the stamp, the expected and the found suite; a name outside the folder's
    layout (``<name>/shard-NN.json``) is refused naming the expected path; the folder's own layout is written
    and joins the ledger with its command. Outside any report folder nothing is stamped."""
    sha = _suite_sha(fidelity_project)
    store = tmp_path / "good"
    assert main(["capture", "--model", str(fidelity_project / "models" / "good"), "--suite",
                 str(fidelity_project / "suite"), "--out", str(store), "--shards", "0", "--quiet"]) == 0
    other = _stamped(tmp_path / "other", OTHER)
    before = _snapshot(other)
    capsys.readouterr()
    assert main(_replay_argv(fidelity_project, store, other / "x")) == 2
    err = capsys.readouterr().err
    assert (f"{other / STAMP}: the report folder holds reports of another suite: expected suite_token_sha256 {sha}, "
            f"found {OTHER}") in err, err
    assert _snapshot(other) == before

    mine = _stamped(tmp_path / "mine", sha)
    before = _snapshot(mine)
    for out, found in ((mine / "x.json", "x.json"), (mine / "y", "y/shard-00.json")):
        assert main(_replay_argv(fidelity_project, store, out)) == 2
        err = capsys.readouterr().err
        assert (f"{mine / STAMP}: replay --out inside a report folder: expected x/shard-NN.json (--out {mine / 'x'}), "
                f"found {found}") in err, err
        assert "Traceback" not in err
        assert _snapshot(mine) == before

    assert main(_replay_argv(fidelity_project, store, mine / "x")) == 0, capsys.readouterr().err
    doc = check_ledger(mine)
    assert doc is not None and doc["suite_token_sha256"] == sha
    assert set(doc["files"]) == {"ladder.md", "x/shard-00.json", "x/shard-00.md"}
    for rel in ("x/shard-00.json", "x/shard-00.md"):
        assert doc["files"][rel]["sha256"] == sha256_file(mine / rel)
        assert doc["runs"][doc["files"][rel]["run"]]["command"] == "fidelity replay"

    plain = tmp_path / "plain"
    assert main(_replay_argv(fidelity_project, store, plain / "r.json")) == 0
    assert (plain / "r.json").is_file() and not (plain / STAMP).exists() and not (tmp_path / STAMP).exists()


def test_allocate_check_of_another_suite_is_refused_before_the_search(tmp_path: Path, fidelity_project: Path,
                                                                      tiny_corpus: Path, tiny_tokenizer: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``allocate --check CONFIG`` measures the proposals on CONFIG's suite: one other than ``--suite``'s (the
    suite the search measured) is refused before anything is computed, naming both suite_token_sha256 values;
    nothing is written. A ``check`` entry that is a symbolic link is refused too."""
    from harness.inputs.suite import build_suite

    other = build_suite(tiny_corpus, tiny_tokenizer, n_ctx=32, n_contexts=8, n_shards=4, seed=7, out=tmp_path / "suite")
    config = tmp_path / "fidelity.toml"
    text = (fidelity_project / "fidelity.toml").read_text().replace('path = "suite"', f'path = "{tmp_path / "suite"}"')
    for rel in ("models/reference", "models/good", "models/bad", "lm_head.safetensors", '"reference"'):
        bare = rel.strip('"')
        text = text.replace(f'"{bare}"', f'"{fidelity_project / bare}"')
    config.write_text(text)
    out = tmp_path / "alloc"
    argv = _argv("allocate", fidelity_project, out)
    capsys.readouterr()
    assert main([*argv, "--check", str(config)]) == 2
    err = capsys.readouterr().err
    assert (f"--check {config}: its suite {tmp_path / 'suite'}: expected the suite of --suite "
            f"({fidelity_project / 'suite'}, suite_token_sha256 {_suite_sha(fidelity_project)}), found "
            f"suite_token_sha256 {other.suite_token_sha256}") in err, err
    assert "Traceback" not in err and not out.exists()

    out.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (out / "check").symlink_to(tmp_path / "elsewhere")
    assert main([*argv, "--check", str(fidelity_project / "fidelity.toml")]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'check'}: report folder entry: expected a folder of the report folder, found a symbolic link" in err
    assert list((tmp_path / "elsewhere").iterdir()) == []
