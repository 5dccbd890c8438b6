"""A candidate's tags select its cases with ``-k`` (harness/plugin/keywords.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.inputs.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(pytester: pytest.Pytester, fidelity_project: Path) -> pytest.Pytester:
    """The tiny project with tags that differ from the names: good is "rtn", bad is "hqq", both "int4"."""
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    toml = pytester.path / "fidelity.toml"
    text = toml.read_text("utf-8").replace('tags = ["noise-0.02"]', 'tags = ["rtn", "int4"]')
    toml.write_text(text.replace('tags = ["noise-0.5"]', 'tags = ["hqq", "int4"]'), "utf-8")
    return pytester


def _collected(result: pytest.RunResult) -> list[str]:
    return [line.split("::", 1)[1] for line in result.outlines if "::" in line]


def test_k_tag_selects_the_tagged_candidates_cases(project: pytest.Pytester) -> None:
    got = _collected(project.runpytest("--collect-only", "-q", "-k", "hqq"))
    # bad's four shard cases, its tail case and the pair it is part of; no window case, nothing of good
    assert got == [f"test_fidelity[bad-shard{s:02d}]" for s in range(4)] + ["test_tails[tails-bad]",
                                                                               "test_paired[pair-good-vs-bad]"]
    got = _collected(project.runpytest("--collect-only", "-q", "-m", "fidelity", "-k", "int4 and not rtn"))
    assert got == [f"test_fidelity[bad-shard{s:02d}]" for s in range(4)]
    got = _collected(project.runpytest("--collect-only", "-q", "-m", "fidelity_tails", "-k", "RTN or hqq"))
    assert got == ["test_tails[tails-good]", "test_tails[tails-bad]"]  # -k is case-insensitive


def test_k_tag_on_the_embedded_default() -> None:
    """``-k rtn`` selects every candidate tagged rtn, not only those whose name says so; ``-k hqq`` the one tagged hqq."""
    def selected(word: str) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "--collect-only", "-q", "-m", "fidelity",
                              "-k", word, "-p", "no:randomly"], cwd=ROOT, capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        return {m.group(1) for m in re.finditer(r"test_fidelity\[(.+)-shard\d+\]", out.stdout)}

    tagged = {c.name for c in load_config(ROOT / "fidelity.toml").candidates if "rtn" in c.tags}
    assert {"int8", "int4_g32", "int3_g32"} <= tagged
    assert selected("rtn") == tagged
    assert selected("hqq") == {"int4_g32_b"}


@pytest.mark.parametrize("tag", ["two words", "not", "-lead", "a/b", ""])
def test_a_tag_k_cannot_select_is_refused(tmp_path: Path, fidelity_project: Path, tag: str) -> None:
    shutil.copytree(fidelity_project, tmp_path / "p")
    toml = tmp_path / "p" / "fidelity.toml"
    toml.write_text(toml.read_text("utf-8").replace('"noise-0.02"', f'"{tag}"'), "utf-8")
    with pytest.raises(ConfigError, match=r"candidates\[0\]\.tags of 'good': expected words pytest -k can select.*found"):
        load_config(toml)
