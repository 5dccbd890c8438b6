"""``fidelity replay`` is the command-line twin of one pytest case; and the security posture of the code."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import harness
from harness.cli.main import main


def _strip(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in ("timing", "created")}


def test_replay_equals_the_pytest_case(pytester: pytest.Pytester, fidelity_project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.capture.loop import capture

    root = pytester.path
    shutil.copytree(fidelity_project, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("models"))
    capture("transformers", fidelity_project / "models" / "good", root / "suite", root / "cand", progress=False)
    toml = root / "fidelity.toml"
    text = toml.read_text().split("[[candidates]]")[0].replace('model = "models/reference"\n', "")
    toml.write_text(text + '[[candidates]]\nname = "stored"\nstore = "cand"\n')
    pytester.runpytest("-p", "no:cacheprovider", "-k", "shard01", "--fidelity-update-baselines").assert_outcomes(passed=1)
    case = json.loads((root / "fidelity-reports" / "stored" / "shard-01.json").read_text())

    out = root / "replayed" / "stored-01.json"
    argv = ["replay", "--suite", str(root / "suite"), "--reference", str(root / "reference"), "--candidate", str(root / "cand"),
            "--head", str(root / "lm_head.safetensors"), "--shards", "1", "--n-boot", "500", "--name", "stored",
            "--reference-name", "bf16", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert f"{out}: written (+ stored-01.md)" in capsys.readouterr().out
    assert _strip(json.loads(out.read_text())) == _strip(case)


def test_replay_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    assert "--candidate-head" in capsys.readouterr().out


# ----------------------------------------------------------------------------- security posture

_SOURCES = sorted(Path(harness.__file__).parent.rglob("*.py"))


def _code_lines() -> list[tuple[Path, int, str]]:
    out = []
    for p in _SOURCES:
        for i, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            out.append((p, i, code))
    return out


@pytest.mark.parametrize("pattern", [r"\btorch\.load\b", r"\bpickle\.loads?\b", r"\bimport pickle\b", r"shell\s*=\s*True",
                                     r"\bos\.system\b", r"\bos\.popen\b", r"(?<![.\w])eval\(", r"(?<![.\w])exec\(",
                                     r"allow_pickle\s*=\s*True", r"weights_only\s*=\s*False"])
def test_no_unsafe_calls(pattern: str) -> None:
    hits = [f"{p.name}:{i}: {c.strip()}" for p, i, c in _code_lines() if re.search(pattern, c)]
    assert not hits, hits


def test_trust_remote_code_only_from_the_cli_flag() -> None:
    """Every trust_remote_code value is a parameter default False or the explicit --trust-remote-code flag."""
    seen = 0
    for p, i, c in _code_lines():
        for m in re.finditer(r"trust_remote_code\s*[=:]\s*([^,)\n]+)", c):
            value = m.group(1).strip()
            assert value in ("bool = False", "trust_remote_code", "a.trust_remote_code", "options.trust_remote_code", '"trust_remote_code"'), f"{p.name}:{i}: {c.strip()}"
            seen += 1
    assert seen >= 4  # the check is not vacuous
    cfg = (Path(harness.__file__).parent / "inputs" / "config.py").read_text()
    assert "trust_remote_code" not in cfg, "fidelity.toml must not be able to turn on remote code"


@pytest.mark.parametrize(("flag", "value", "problem"), [
    ("--name", "my-q4", "not letters, digits, '.', '_', '+' starting"),  # '-' would make pair names ambiguous
    ("--name", "ladder.json", "the report folder's own"),
    ("--reference-name", "con", "a name Windows reserves"),
])
def test_replay_names_follow_the_configurations_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str,
                                                     value: str, problem: str) -> None:
    """``replay --name`` takes exactly the names ``fidelity.toml`` takes for a candidate (and ``--reference-name``
    those of a reference, ``-`` included): refused with exit 2 before any input is read."""
    names = {"--name": "int8", "--reference-name": "Qwen3-8B", flag: value}
    argv = ["replay", "--suite", str(tmp_path / "suite"), "--reference", str(tmp_path / "ref"), "--candidate",
            str(tmp_path / "cand"), "--head", str(tmp_path / "h.safetensors"), "--out", str(tmp_path / "out"),
            *[x for kv in names.items() for x in kv]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag}: expected" in err and problem in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_replay_default_name_follows_the_rule(tmp_path: Path) -> None:
    from harness.inputs.config import name_problem
    from harness.run.replay.stores import default_name

    assert default_name(tmp_path / "Qwen3-8B-Q4_K_M") == "Qwen3_8B_Q4_K_M"
    assert default_name(tmp_path / "-.x") == "x"
    assert name_problem(default_name(tmp_path / "my q4+")) is None
