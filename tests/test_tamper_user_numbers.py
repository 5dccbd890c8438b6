"""Tamper campaign, numbers from users: parsed strictly (ASCII digits, finite, stated ranges); a Unicode digit
is a named refusal, never a raw ValueError, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("budget", ["\u00b2", "\u0663", "\uff11\uff10"])  # superscript two, Arabic-Indic three, fullwidth 10
def test_allocate_budget_with_a_unicode_digit_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], budget: str) -> None:
    rc = main(["allocate", "--reference", str(ROOT / "fixtures" / "model"), "--suite", str(ROOT / "fixtures" / "suite"),
               "--base", "int4_g32", "--budget", budget, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err and "ValueError" not in err, err
    assert f"budget {budget!r}: expected a number of bytes, 'base' or one of the choices" in err
    assert not (tmp_path / "out").exists()
