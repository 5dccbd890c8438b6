"""Tamper campaign, names: a tag never equals another candidate's or the reference's name, the reference's
name obeys the candidates' rule, and every string that reaches a card is validated or escaped by the one
helper (harness/io/escape.py). Each hostile name is refused when the configuration loads, in one line
naming the key, the rule and the found value; a pytest run exits non-zero without INTERNALERROR and writes
no report and no baseline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.inputs.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


def _project(fidelity_project: Path, dst: Path, old: str, new: str) -> Path:
    shutil.copytree(fidelity_project, dst, symlinks=True)
    toml = dst / "fidelity.toml"
    text = toml.read_text()
    assert old in text
    toml.write_text(text.replace(old, new))
    return toml


HOSTILE_REFERENCE = [
    'name = "bf16\\n---\\nlicense: mit"', 'name = "<script>alert(1)</script>"', 'name = "[x](javascript:alert(1))"',
    'name = "ref`code`"', 'name = "a|b"', 'name = "con"', 'name = "-k"',
]


@pytest.mark.parametrize("line", HOSTILE_REFERENCE)
def test_hostile_reference_name_refused(fidelity_project: Path, tmp_path: Path, line: str) -> None:
    toml = _project(fidelity_project, tmp_path / "p", 'name = "bf16"', line)
    with pytest.raises(ConfigError) as exc:
        load_config(toml)
    msg = str(exc.value)
    assert msg.startswith(f"{toml}: reference.name: expected ") and "found '" in msg and "\n" not in msg, msg


@pytest.mark.parametrize(("tag", "whose"), [("bad", "the name of candidate 'bad'"), ("bf16", "the reference's name")])
def test_tag_equal_to_another_name_refused(fidelity_project: Path, tmp_path: Path, tag: str, whose: str) -> None:
    toml = _project(fidelity_project, tmp_path / "p", 'tags = ["noise-0.02"]', f'tags = ["noise-0.02", "{tag}"]')
    with pytest.raises(ConfigError, match=rf"candidates tags of 'good': expected tags that are no other candidate's or the "
                                          rf"reference's name \(-k {tag} would select both\), found '{tag}', {whose}"):
        load_config(toml)


def test_tag_equal_to_its_own_name_is_allowed(fidelity_project: Path, tmp_path: Path) -> None:
    toml = _project(fidelity_project, tmp_path / "p", 'tags = ["noise-0.02"]', 'tags = ["noise-0.02", "good"]')
    assert load_config(toml).candidate("good").tags == ("noise-0.02", "good")


def test_project_configurations_load() -> None:
    for name in ("fidelity.toml", "fidelity-gguf.toml", "fidelity-hybrid.toml"):
        load_config(ROOT / name)


def test_update_baselines_with_a_colliding_tag_writes_nothing(fidelity_project: Path, tmp_path: Path) -> None:
    """``-k bad --fidelity-update-baselines`` would have rewritten ``good``'s baseline too (tagged ``bad``)."""
    _project(fidelity_project, tmp_path / "p", 'tags = ["noise-0.02"]', 'tags = ["noise-0.02", "bad"]')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "-q", "-p", "no:cacheprovider", "-m", "fidelity",
                          "-k", "bad", "--fidelity-update-baselines"], cwd=tmp_path / "p", env=env, capture_output=True,
                         text=True, check=False, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "INTERNALERROR" not in text and "Traceback" not in text, text[-3000:]
    assert "found 'bad', the name of candidate 'bad'" in text
    assert not (tmp_path / "p" / "baselines").exists() and not (tmp_path / "p" / "fidelity-reports").exists()


def test_card_body_escapes_what_it_is_given() -> None:
    """The card's body renders the reference and the base model through the escape helper: even a name that
    got past the configuration's rules (a card re-rendered from a results.json) forms no tag or link."""
    markdown_it = pytest.importorskip("markdown_it")
    from harness.reports.card import render_body

    body = render_body({"reference": "a`<script>`b", "base_model": None}, [], False, "")
    html = markdown_it.MarkdownIt("commonmark").render(body)
    assert "<script>" not in html and "<code>a`&lt;script&gt;`b</code>" in html


def test_reference_name_may_hold_a_dash(fidelity_project: Path, tmp_path: Path) -> None:
    """A model's own name (``Qwen3-8B``, a published layout's ``hidden-Qwen3-8B``) is a valid reference name:
    the reference never takes part in a paired comparison's ``<a>-vs-<b>`` name; a candidate's ``-`` is refused."""
    toml = _project(fidelity_project, tmp_path / "p", 'name = "bf16"', 'name = "Qwen3-8B"')
    assert load_config(toml).reference.name == "Qwen3-8B"
    toml2 = _project(fidelity_project, tmp_path / "q", 'name = "good"', 'name = "go-od"')
    with pytest.raises(ConfigError, match=r"candidates\[\d+\]\.name: expected letters, digits, '_', '.', '\+' starting"):
        load_config(toml2)
