"""Your own model: README.md's own-model block and docs/your-model.md's worked example run as written, and
``[dataset] path`` in a configuration (suite, reference and head from a reference dataset) refuses wrong input
in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.inputs.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures"
MARKER = "<!-- byo-example:"
OWN_MARKER = "<!-- own-model:"
GUIDE = ROOT / "docs" / "your-model.md"


def readme_block(marker: str = MARKER, page: Path = GUIDE) -> str:
    """The fenced block right after ``marker`` in ``page``, verbatim."""
    text = page.read_text("utf-8")
    at = text.index(marker)
    m = re.compile(r"```bash\n(.*?)\n```\n", re.S).search(text, at)
    assert m is not None and text[at:m.start()].count("\n") == 1, "the marker must sit right above a ```bash block"
    return m.group(1)


def readme_printed() -> str:
    """The output block docs/your-model.md shows for the example's last command."""
    text = GUIDE.read_text("utf-8")
    at = text.index("The last command prints", text.index(MARKER))
    m = re.compile(r"```\n(.*?)\n```\n", re.S).search(text, at)
    assert m is not None
    return m.group(1)


def _git_status() -> list[str]:
    """Untracked files of the clone (what a command run there would leave behind)."""
    out = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.startswith("??")]


#: What the example writes into its own folder, none of which may appear in the clone.
EXAMPLE_OUTPUTS = ("dataset", "make_int8.py", "my-int8", "my.toml", "baselines", ".pytest_cache")


@pytest.mark.slow  # a dataset, a checkpoint and two pytest runs of one candidate x 2 shards: ~45 s
def test_readme_example_runs_as_written_in_an_empty_folder(tmp_path: Path) -> None:
    work = tmp_path / "empty"
    work.mkdir()
    before = _git_status()
    already = [n for n in EXAMPLE_OUTPUTS if (ROOT / n).exists()]
    env = dict(os.environ, REPO=str(ROOT), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTEST_ADDOPTS", None)
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block()], cwd=work, env=env,
                         capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    # two runs, each 2 candidate x shard cases + 1 tail + 3 windows, all passed; the header names my.toml
    assert len(re.findall(r"^=+ 6 passed in [\d.]+s", res.stdout, re.M)) == 2, res.stdout[-3000:]
    assert res.stdout.count(f"fidelity: {work / 'my.toml'} (1 candidate x 2 shards;") == 2
    assert "baseline written: " in res.stdout
    last = res.stdout[res.stdout.rindex("test session starts"):]
    row = re.search(r"^\| my_int8 +\| — / 16\.00 +\| [\d.]+ MiB \| 2 +\| \S+ \[\S+, \S+\] +\|.* ≤ \S+ +\| 0\.9\d+ \| pass +\|$",
                    last, re.M)  # bits per weight: a plain bf16 checkpoint has no quantized linears
    assert row, last
    # the README shows that run: the same lines, the numbers as printed on the machine that measured them
    shown = readme_printed().splitlines()
    assert shown[-1].startswith("=") and " 6 passed in " in shown[-1]
    assert [l.split("|")[1].strip() for l in shown if l.startswith("| my_int8")] == ["my_int8"]
    for line in shown:
        if not re.search(r"\d\.\d|passed in", line):  # every line without a measured number is printed as shown
            assert line in last.splitlines(), line
    for f in ("baselines/my_int8.json", "fidelity-reports/my_int8/shard-00.json", "fidelity-reports/my_int8/shard-01.md",
              "fidelity-reports/ladder.md", "fidelity-reports/ladder.json", "my-int8/config.json",
              "my-int8/model.safetensors", "dataset/dataset.json"):
        assert (work / f).is_file(), f
    doc = json.loads((work / "baselines" / "my_int8.json").read_text())
    assert sorted(doc["shards"]) == ["00", "01"]
    assert _git_status() == before  # nothing written into the clone
    assert [n for n in EXAMPLE_OUTPUTS if (ROOT / n).exists()] == already


#: What README.md's own-model block writes into its own folder.
OWN_OUTPUTS = ("my-project", "fidelity-reports")


@pytest.mark.slow  # a 16-context suite, the reference's and the candidate's captures, two pytest runs: ~40 s
def test_readme_own_model_block_runs_as_written_in_an_empty_folder(tmp_path: Path) -> None:
    """README.md "Your own model": `fidelity init` (suite, head, configuration), baselines on purpose, then the
    gated ladder."""
    work = tmp_path / "empty"
    work.mkdir()
    before = _git_status()
    env = dict(os.environ, REPO=str(ROOT), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTEST_ADDOPTS", None)
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block(OWN_MARKER, ROOT / "README.md")], cwd=work,
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    project = work / "my-project"
    assert res.stdout.count(f"fidelity: {project / 'fidelity.toml'} (1 candidate x 2 shards;") == 2, res.stdout[-3000:]
    assert "baseline written: " in res.stdout
    last = res.stdout[res.stdout.rindex("test session starts"):]
    assert re.search(r"^\| mine +\|.* [\d.]+ MiB \| 2 +\| .*\| pass +\|$", last, re.M), last
    assert re.search(r"^=+ \d+ passed in [\d.]+s", last, re.M) and " failed" not in last, last[-2000:]
    assert sorted(json.loads((project / "baselines" / "mine.json").read_text())["shards"]) == ["00", "01"]
    assert (project / "reference" / "capture.json").is_file()
    assert _git_status() == before  # nothing written into the clone
    assert not [n for n in OWN_OUTPUTS if (ROOT / n).exists() and n not in ("fidelity-reports",)]


# ------------------------------------------------------------------ [dataset] path, without scoring
@pytest.fixture
def fake_dataset(tmp_path: Path) -> Path:
    """A dataset folder's layout (real suite, placeholder reference and head): enough for config load."""
    ds = tmp_path / "dataset"
    shutil.copytree(FIX / "suite", ds / "suite")
    (ds / "reference").mkdir()
    (ds / "reference" / "capture.json").write_text("{}")
    (ds / "head").mkdir()
    (ds / "head" / "lm_head.safetensors").write_bytes(b"")
    (ds / "dataset.json").write_text(json.dumps({"schema": "fidelity.dataset/1",
                                                 "reference": {"name": "bf16", "shards": [0, 2]}}))
    (tmp_path / "cand").mkdir()
    (tmp_path / "cand" / "config.json").write_text("{}")
    return ds


def _toml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "my.toml"
    p.write_text(text)
    return p


CAND = '\n[[candidates]]\nname = "mine"\nmodel = "cand"\n'


def test_dataset_key_fills_suite_reference_head_and_shards(tmp_path: Path, fake_dataset: Path) -> None:
    cfg = load_config(_toml(tmp_path, '[dataset]\npath = "dataset"\n' + CAND))
    assert cfg.suite == fake_dataset / "suite"
    assert cfg.reference.store == fake_dataset / "reference"
    assert cfg.reference.head == fake_dataset / "head" / "lm_head.safetensors"
    assert (cfg.reference.name, cfg.reference.model, cfg.reference_shards, cfg.dataset) == ("bf16", None, (0, 2), fake_dataset)


@pytest.mark.parametrize(("text", "edit", "message"), [
    ('[dataset]\npath = "nowhere"\n', None, "dataset.path: *nowhere: expected a dataset folder (made by fidelity dataset build), found no such folder"),
    ('[dataset]\npath = "cand"\n', None, "dataset.path: *cand/dataset.json: expected the dataset manifest *, found no such file"),
    ('[dataset]\npath = "dataset"\n[suite]\npath = "dataset/suite"\n', None,
     "[dataset] supplies the suite, the reference and the head: expected no [suite] beside it, found [suite]"),
    ('[dataset]\npath = "dataset"\npaht = "x"\n', None, "unknown key dataset.paht (did you mean 'path'?)"),
    ('[dataset]\npath = "dataset"\n', {"schema": "fidelity.suite/1"}, "dataset.json: schema: expected 'fidelity.dataset/1', found 'fidelity.suite/1'"),
    ('[dataset]\npath = "dataset"\n', {"schema": "fidelity.dataset/1", "reference": {"name": "bf16", "shards": []}},
     "dataset.json: reference.shards: expected a non-empty list of shard numbers, found []"),
])
def test_dataset_key_refuses_wrong_input(tmp_path: Path, fake_dataset: Path, text: str, edit: dict[str, object] | None,
                                         message: str) -> None:
    if edit is not None:
        (fake_dataset / "dataset.json").write_text(json.dumps(edit))
    with pytest.raises(ConfigError) as err:
        load_config(_toml(tmp_path, text + CAND))
    from fnmatch import fnmatchcase

    assert str(err.value).startswith(str(tmp_path / "my.toml") + ": ")
    assert fnmatchcase(str(err.value), "*" + message.replace("[", "[[]")), str(err.value)


def test_dataset_missing_part_is_named(tmp_path: Path, fake_dataset: Path) -> None:
    (fake_dataset / "head" / "lm_head.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"head/lm_head\.safetensors: expected this part of the dataset, found no such file"):
        load_config(_toml(tmp_path, '[dataset]\npath = "dataset"\n' + CAND))


def test_missing_candidate_store_is_refused_at_load(tmp_path: Path, fake_dataset: Path) -> None:
    text = '[dataset]\npath = "dataset"\n[[candidates]]\nname = "mine"\nstore = "captures/typo"\n'
    with pytest.raises(ConfigError) as err:
        load_config(_toml(tmp_path, text))
    assert str(err.value) == (f"{tmp_path / 'my.toml'}: candidates[0].store of 'mine': expected a capture store folder "
                              f"holding capture.json, found no such path: {tmp_path / 'captures' / 'typo'}")


def test_dataset_shards_select_the_cases(pytester: pytest.Pytester, fake_dataset: Path) -> None:
    """Only the shards the dataset holds a reference for become cases; asking for another is a usage error."""
    shutil.copytree(fake_dataset.parent, pytester.path, dirs_exist_ok=True)
    (pytester.path / "my.toml").write_text('[dataset]\npath = "dataset"\n' + CAND)
    collected = pytester.runpytest("my.toml", "--collect-only", "-q", "-m", "fidelity")
    collected.stdout.fnmatch_lines(["my.toml::test_fidelity[[]mine-shard00[]]", "my.toml::test_fidelity[[]mine-shard02[]]",
                                    "*2/6 tests collected*"])
    refused = pytester.runpytest("my.toml", "--collect-only", "--fidelity-shards", "1-2")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*dataset/dataset.json: --fidelity-shards 1-2: expected shards the dataset holds a "
                                  "reference for (0,2), found 1"])


@pytest.mark.parametrize(("engine", "model", "message"), [
    ("transformers", "fixtures/gguf/fixture-q8_0.gguf", "engine 'transformers' expects a model folder (config.json + *.safetensors), "
                                                        "found a file: */fixture-q8_0.gguf; a GGUF file needs engine = \"llamacpp\""),
    ("llamacpp", "fixtures/model", "engine 'llamacpp' expects a GGUF file, found a folder: */fixtures/model"),
    ("transformers", "fixtures/suite", "expected a Hugging Face model folder holding config.json, found none in */fixtures/suite"),
])
def test_candidate_model_of_the_wrong_kind_is_named_at_load(tmp_path: Path, fake_dataset: Path, engine: str, model: str,
                                                            message: str) -> None:
    from fnmatch import fnmatchcase

    text = f'[dataset]\npath = "dataset"\n[[candidates]]\nname = "mine"\nengine = "{engine}"\nmodel = "{ROOT / model}"\n'
    with pytest.raises(ConfigError) as err:
        load_config(_toml(tmp_path, text))
    assert fnmatchcase(str(err.value), f"{tmp_path / 'my.toml'}: candidates[[]0[]].model of 'mine': {message}"), str(err.value)


def test_readme_selection_examples_select_what_they_say(pytester: pytest.Pytester) -> None:
    """docs/running.md: the one-candidate line selects exactly one candidate's cases, the one-shard line
    one case per candidate, and -k by a name is the substring match the page warns about."""
    from harness.inputs.config import load_config

    def _collected(*args: str) -> list[str]:
        res = pytester.runpytest(str(ROOT / "fidelity.toml"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
                                 "--collect-only", "-q", *args)
        assert res.ret == 0, res.stdout.str()
        return [l for l in res.stdout.lines if l.startswith("fidelity.toml::")]

    names = [c.name for c in load_config(ROOT / "fidelity.toml").candidates]
    one = [i for i in _collected("--fidelity-candidates", "int4_g32") if "::test_fidelity[" in i]
    assert one == [f"fidelity.toml::test_fidelity[int4_g32-shard{k:02d}]" for k in range(6)]
    shard = _collected("-k", "shard01")
    assert shard == [f"fidelity.toml::test_fidelity[{n}-shard01]" for n in names]
    substring = {i.split("[")[1].split("-shard")[0] for i in _collected("-k", "int4_g32", "-m", "fidelity")}
    assert substring == {"int4_g32", "int4_g32_b", "int4_g32_sr1", "int4_g32_sr2"}


def test_readme_commands_leave_no_untracked_outputs() -> None:
    """Every output a command of README.md or docs/ writes at the repository root (``--out``,
    ``--fidelity-report-dir``) is ignored by git, so following the guide leaves ``git status`` clean (the
    examples above run elsewhere)."""
    blocks: list[str] = []
    inside: list[str] | None = None
    skip_next = skipping = False
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for line in "\n".join(p.read_text("utf-8") for p in pages).splitlines():
        if inside is None:
            if line.startswith((MARKER, OWN_MARKER)):
                skip_next = True
            elif line.startswith("```"):
                inside, skipping, skip_next = [], skip_next, False
        elif line.startswith("```"):
            if not skipping:
                blocks.append("\n".join(inside))
            inside = None
        else:
            inside.append(line)
    outs = {m for b in blocks for m in re.findall(r"--(?:out|fidelity-report-dir) ([^\s\\`]+)", b)}
    outs = {o for o in outs if not o.startswith(("fixtures/", "/", "DIR", "X.", "$", "PROJECT"))}
    assert {"captures/int4_g32", "published/", "aggregate/", "ref.kld"} <= outs  # the parser sees the commands
    for out in sorted(outs):
        probe = out if Path(out).suffix else out.rstrip("/") + "/probe"
        res = subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT)
        assert res.returncode == 0, f"README writes {out}, which git does not ignore"
