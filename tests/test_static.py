"""Static checks as part of the test command: ``mypy`` (strict, configured in pyproject.toml) on
``harness/`` and ``ruff check`` on the repository. Each runs as a subprocess and the test fails with
the tool's own output. Both tools are pinned in the ``test`` extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1800)


def test_mypy_strict_clean() -> None:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    out = _run([sys.executable, "-m", "mypy", "harness"])
    assert out.returncode == 0, f"mypy harness (strict) failed:\n{out.stdout}{out.stderr}"


def test_ruff_clean() -> None:
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    out = _run([sys.executable, "-m", "ruff", "check", "."])
    assert out.returncode == 0, f"ruff check failed:\n{out.stdout}{out.stderr}"
