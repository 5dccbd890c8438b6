"""The Python API (harness/api.py): docs/examples/api_example.py runs as written, and its figures are the
command line's for the same inputs (`fidelity ladder`, `fidelity replay`), to the last bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: a case failed its baseline (not this test's concern)
    return r.stdout


def test_the_example_runs_and_agrees_with_the_command_line(tmp_path: Path) -> None:
    # one thread in every process: the same summation order, so the figures must agree exactly
    env = dict(os.environ, PYTHONPATH=str(ROOT), FIDELITY_THREADS="1")
    printed = _run(["docs/examples/api_example.py", str(tmp_path / "api")], env)
    got = json.loads((tmp_path / "api" / "api-example.json").read_text())
    assert "int8: mean KLD" in printed and "int4_g32 shard 0: mean KLD" in printed

    _run(["-m", "harness", "ladder", "fidelity.toml", "--candidates", "int8", "--shards", "0",
          "--out", str(tmp_path / "cli"), "--quiet"], env)
    rows = json.loads((tmp_path / "cli" / "ladder.json").read_text())["rows"]
    assert [(r["candidate"], r["mean_kld"]) for r in rows] == list(got["ladder"].items())
    assert json.loads((tmp_path / "api" / "ladder" / "ladder.json").read_text())["rows"][0]["mean_kld"] == rows[0]["mean_kld"]

    _run(["-m", "harness", "replay", "--suite", "fixtures/suite", "--reference", "fixtures/reference",
          "--candidate", str(tmp_path / "api" / "int4_g32.store"), "--head", "fixtures/lm_head.safetensors",
          "--shards", "0", "--out", str(tmp_path / "replay.json")], env)
    m = json.loads((tmp_path / "replay.json").read_text())["metrics"]
    assert (m["kld"]["mean"], m["kld"]["ci95"], m["top1"]["agreement"]) == (
        got["score"]["int4_g32"], got["score"]["ci95"], got["score"]["top1"])
    assert 0 < rows[0]["mean_kld"] < got["score"]["int4_g32"]  # int8 is closer to the reference than int4


def test_ladder_entry_names_what_is_missing() -> None:
    from harness.api import Ladder

    with pytest.raises(KeyError, match="'x' is not in the ladder"):
        Ladder(entries=(), report_dir=Path("r"), failures=(), skipped=(), reused=()).entry("x")
