"""Error categories (harness/errors.py) and the ``fidelity`` command's exit status, which follows the
class of the error and never its text (docs/refuses.md, "Exit status")."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.errors import (
    EXTRAS,
    FidelityError,
    MissingPackageError,
    OutputError,
    UsageError,
    VerificationError,
    pip_extra,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_extras_are_the_packages_own() -> None:
    """Every install command an error names is an extra pyproject.toml declares, and every extra is known."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(declared)


def test_missing_package_message_names_the_install_command() -> None:
    e = MissingPackageError.extra("llama-cpp-python", "llamacpp")
    assert str(e) == "llama-cpp-python is not installed: pip install 'fidelity-harness[llamacpp]'"
    e = MissingPackageError.extra("ray", "ray", needed_for="the ray executor", hint="or use --executor serial")
    assert str(e) == "the ray executor: ray is not installed: pip install 'fidelity-harness[ray]' (or use --executor serial)"
    with pytest.raises(ValueError, match="expected one of llamacpp, .*found 'llama'"):
        pip_extra("llama")


def test_a_usage_error_is_still_a_value_error() -> None:
    """Library callers that caught the ValueError of a bad setting keep catching it."""
    assert issubclass(UsageError, ValueError) and issubclass(UsageError, FidelityError)


@pytest.mark.parametrize(("error", "code"), [
    (VerificationError("suite.json", "manifest_sha256", "a", "b"), 1),
    (UsageError("--shards: expected a number, found 'x'"), 2),
    (FidelityError("some other refusal"), 2),
    (OutputError("out/", "writing", "disk full"), 2),
    (MissingPackageError.extra("gguf", "gguf", needed_for="GGUF layouts"), 3),
])
def test_exit_status_follows_the_class(error: FidelityError, code: int, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    def refuse(workers: int = 1) -> int:
        raise error

    monkeypatch.setattr(cli_main, "choose_threads", refuse)  # the first step inside the command's error handling
    assert cli_main.main(["suite", "show", str(tmp_path)]) == code
    err = capsys.readouterr().err
    assert err == f"fidelity: error: {error}\n"


def test_a_bad_thread_count_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    """FIDELITY_THREADS is read before any command runs: a bad value is one line and exit 2 (it was a traceback)."""
    monkeypatch.setenv("FIDELITY_THREADS", "many")
    assert cli_main.main(["suite", "show", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "fidelity: error: FIDELITY_THREADS/OMP_NUM_THREADS: expected a positive integer, found 'many'\n"


def test_a_missing_optional_package_exits_3(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path, tiny_tokenizer: Path) -> None:
    """A datasets source without the datasets package: exit 3, the install command, nothing written."""
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    (tmp_path / "rows.jsonl").write_text('{"text": "a b c"}\n')
    code = cli_main.main(["suite", "build", "--from-dataset", str(tmp_path / "rows.jsonl"), "--corpus-out", str(tmp_path / "c"),
                          "--tokenizer", str(tiny_tokenizer), "--n-ctx", "4", "--contexts", "1", "--shards", "1",
                          "--seed", "0", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "datasets is not installed: pip install 'fidelity-harness[datasets]'" in err and "Traceback" not in err
    assert not (tmp_path / "s").exists() and not (tmp_path / "c").exists()


def test_a_flag_that_needs_another_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "cand").mkdir()
    code = cli_main.main(["replay", "--candidate", str(tmp_path / "cand"), "--out", str(tmp_path / "o")])
    assert code == 2 and "replay needs --suite, --reference and --head" in capsys.readouterr().err
