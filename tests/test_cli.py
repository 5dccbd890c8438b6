"""The ``fidelity`` command: subcommands, exit codes and error messages (in-process via ``main``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_is_instant_and_imports_no_torch() -> None:
    code = "import sys\nfrom harness.cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\nassert 'torch' not in sys.modules, 'torch imported by --help'\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "suite" in r.stdout and "capture" in r.stdout and "export-head" in r.stdout


def test_suite_build_verify_show(tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_corpus: Path, tiny_tokenizer: Path) -> None:
    out = tmp_path / "s"
    code, stdout, _ = run(capsys, "suite", "build", "--corpus", str(tiny_corpus), "--tokenizer", str(tiny_tokenizer),
                          "--n-ctx", "16", "--contexts", "5", "--shards", "2", "--seed", "3", "--out", str(out))
    assert code == 0 and "shards: 2" in stdout
    code, stdout, _ = run(capsys, "suite", "verify", str(out))
    assert code == 0 and "OK (5 contexts x 16 tokens, 2 shards" in stdout
    code, stdout, _ = run(capsys, "suite", "show", str(out))
    assert code == 0 and "strata:" in stdout and "source clusters:" in stdout and "[3, 5)" in stdout

    doc = json.loads((out / "suite.json").read_text())
    doc["seed"] = 4
    (out / "suite.json").write_text(json.dumps(doc))
    code, _, err = run(capsys, "suite", "verify", str(out))
    assert code == 1
    assert err.startswith("fidelity: error: ") and "suite.json: manifest_sha256 (a field was edited): expected" in err
    assert "Traceback" not in err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_corpus: Path, tiny_tokenizer: Path) -> None:
    code, _, err = run(capsys, "suite", "build", "--corpus", str(tiny_corpus), "--tokenizer", str(tiny_tokenizer),
                       "--n-ctx", "64", "--contexts", "10000", "--shards", "2", "--seed", "0", "--out", str(tmp_path / "s"))
    assert code == 2 and "fidelity: error:" in err and "corpus too small" in err and "10000 contexts asked" in err
    with pytest.raises(SystemExit) as e:
        main(["suite", "build", "--corpus", "x", "--tokenizer", "t", "--n-ctx", "0", "--contexts", "1", "--shards", "1", "--seed", "0", "--out", "o"])
    assert e.value.code == 2
    assert "expected a positive integer, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["capture", "--model", "m", "--suite", "s", "--out", "o", "--device", "tpu"])
    assert "expected cpu, cuda or cuda:N" in capsys.readouterr().err


def test_capture_export_head_store_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_model: Path, tiny_suite: Path) -> None:
    store = tmp_path / "store"
    code, stdout, err = run(capsys, "capture", "--model", str(tiny_model), "--suite", str(tiny_suite), "--out", str(store),
                            "--shards", "0,2", "--quiet", "--threads", "1")
    assert code == 0, err
    assert "4/6 contexts captured (hidden_states, width 32)" in stdout
    code, stdout, _ = run(capsys, "store", "verify", str(store), "--suite", str(tiny_suite))
    assert code == 0 and "OK (4 contexts verified, 2 not captured" in stdout
    code, stdout, _ = run(capsys, "export-head", "--model", str(tiny_model), "--out", str(tmp_path / "lm_head.safetensors"))
    assert code == 0 and "weight [300, 32] bfloat16" in stdout and (tmp_path / "lm_head.json").is_file()

    p = store / "ctx-000005.safetensors"
    p.write_bytes(p.read_bytes()[:-10])
    code, _, err = run(capsys, "store", "verify", str(store), "--suite", str(tiny_suite))
    assert code == 1 and "ctx-000005.safetensors: sha256: expected" in err and "Traceback" not in err

    code, _, err = run(capsys, "capture", "--model", str(tiny_model), "--suite", str(tiny_suite), "--out", str(store), "--shards", "7", "--quiet")
    assert code == 2 and "shard 7 (from '7') out of range: the suite has 3 shards" in err


def test_capture_refuses_pickle_only(tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_model: Path, tiny_suite: Path) -> None:
    m = tmp_path / "m"
    m.mkdir()
    shutil.copy(tiny_model / "config.json", m)
    (m / "pytorch_model.bin").write_bytes(b"x")
    code, _, err = run(capsys, "capture", "--model", str(m), "--suite", str(tiny_suite), "--out", str(tmp_path / "o"), "--quiet")
    assert code == 2 and "only pickle weights found (pytorch_model.bin)" in err


def test_python_dash_m(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "harness", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("fidelity ")
