"""``fidelity init`` end to end on the embedded model treated as "yours": the written fidelity.toml runs under
pytest as it is (first run: the ladder and one "no baselines yet" line), and what it cannot use is refused by name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
FX = ROOT / "fixtures"
SMALL = ["--n-ctx", "64", "--contexts", "8", "--shards", "2"]


def _pytest(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), FIDELITY_THREADS="1")
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", str(config), "-p", "no:cacheprovider", *args],
                          cwd=config.parent.parent, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # a suite, a head and three pytest runs of 2 candidates x 2 shards of the tiny model: ~3 min on 2 busy cores
def test_init_writes_a_project_that_pytest_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.txt"  # a text file of the user's own, beside two folders of the fixture corpus
    notes.write_text("\n\n".join(f"Note {i}: the quantized model should agree with the original on every token "
                                 f"of this sentence, number {i}." for i in range(60)), "utf-8")
    out = tmp_path / "proj"
    rc = main(["init", "--reference", str(FX / "model"), "--candidate", str(FX / "candidates" / "int8"),
               "--candidate", f"q4={FX / 'candidates' / 'int4_g32'}", "--corpus", str(FX / "corpus" / "tutorial"),
               str(FX / "corpus" / "faq"), str(notes), *SMALL, "--license", "MIT", "--out", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert f"pytest {out / 'fidelity.toml'}" in printed.out and "suite: 8 contexts x 64 tokens" in printed.out
    cfg = tomllib.loads((out / "fidelity.toml").read_text())
    assert [c["name"] for c in cfg["candidates"]] == ["int8", "q4"]
    assert (out / "suite" / "suite.json").is_file() and (out / "lm_head.safetensors").is_file()
    assert (out / "corpus" / "notes.txt").is_file()  # files are copied into the project

    first = _pytest(out / "fidelity.toml")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    text = first.stdout
    assert "fidelity ladder" in text and "int8" in text and "q4" in text
    assert text.count("no baselines yet: run pytest") == 1 and "--fidelity-update-baselines" in text
    assert " failed" not in text and (out.parent / "fidelity-reports" / "ladder.md").is_file()
    assert not (out / "baselines").exists()

    update = _pytest(out / "fidelity.toml", "--fidelity-update-baselines")
    assert update.returncode == 0, update.stdout[-3000:]
    assert sorted(p.name for p in (out / "baselines").iterdir()) == ["int8.json", "q4.json"]
    gated = _pytest(out / "fidelity.toml")
    assert gated.returncode == 0 and "no baselines yet" not in gated.stdout and " failed" not in gated.stdout
    passed = re.search(r"(\d+) passed", gated.stdout)
    assert passed is not None and int(passed.group(1)) >= 4  # the 2 x 2 cases, now gated, and the run's other cases


@pytest.mark.parametrize(("args", "message"), [
    (["--reference", "fixtures/candidates/ct_w4a16_gptq", "--candidate", "fixtures/candidates/int8"],
     "init --reference fixtures/candidates/ct_w4a16_gptq: expected the unquantized BF16 original, found a quantized "
     "checkpoint (config.json quantization_config, quant_method compressed-tensors): give it as a --candidate"),
    (["--reference", "fixtures/suite", "--candidate", "fixtures/candidates/int8"],
     "init --reference fixtures/suite: expected config.json (the model's configuration), found none in fixtures/suite"),
    (["--reference", "fixtures/model", "--candidate", "fixtures/corpus/heldout.txt"],
     "init --candidate fixtures/corpus/heldout.txt: expected a model folder with config.json, or a .gguf file, "
     "found a .txt file"),
    (["--reference", "fixtures/model", "--candidate", "fixtures/model"],
     "init --candidate fixtures/model: expected a model other than the reference, found the reference itself"),
    (["--reference", "fixtures/model", "--candidate", "a=fixtures/candidates/int8", "--candidate", "a=fixtures/candidates/int4_g32"],
     "init --candidate a=fixtures/candidates/int4_g32: expected unique candidate names (give NAME=PATH), found 'a' twice"),
    (["--reference", "fixtures/model"],
     "init --candidate: expected at least one candidate (a model folder or a .gguf file), found none"),
])
def test_init_refuses_what_it_cannot_use(args: list[str], message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "proj"
    assert main(["init", *args, "--corpus", "fixtures/corpus", *SMALL, "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"fidelity: error: {message}\n"
    assert not out.exists()  # nothing half-written


def test_init_refuses_a_binary_corpus_file_and_a_full_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blob = tmp_path / "weights.bin"
    blob.write_bytes(b"\xff\xfe\x00\x80" * 10)
    args = ["init", "--reference", str(FX / "model"), "--candidate", str(FX / "candidates" / "int8"), *SMALL]
    assert main([*args, "--corpus", str(blob), "--out", str(tmp_path / "p")]) == 2
    assert f"init --corpus {blob}: expected UTF-8 text, found undecodable bytes at offset 0" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main([*args, "--corpus", str(FX / "corpus"), "--out", str(tmp_path / "full")]) == 2
    assert "expected a new or empty folder, found a folder with files in it" in capsys.readouterr().err
    assert (tmp_path / "full" / "x").is_file()
