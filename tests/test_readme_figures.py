"""README.md's measured figures (written by ``docs/figures.py``) against what the current code prints.

Compared exactly: what does not depend on the CPU's arithmetic -- the ladder's header, candidates, sizes,
shards, verdicts and every non-numeric character of its cells, and the case counts. Compared within the
tolerances ``docs/figures.py`` states: the numbers of the ladder (bf16 forward passes are summed in another
order by each CPU's GEMM kernels). Times are not compared; the README names the machine beside each.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "docs" / "figures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


FIG = _figures()
README = (ROOT / "README.md").read_text("utf-8")


def test_every_figure_block_is_filled_and_names_its_machine() -> None:
    recorded = json.loads((ROOT / "docs" / "figures.json").read_text())
    words = f"{recorded['machine']['cpu']}, {recorded['machine']['cores']} cores"  # each line's run names its load
    # The quick tier's line is written after the quick tier ran (it runs this test): checked once recorded.
    for name in ("main-job", "quick-tier") if "quick_tier" in recorded else ("main-job",):
        line = FIG.read_block(README, name)
        assert f"measured on {words}" in line, (name, line)
        assert re.search(r"\d+ passed", line), line
    assert FIG.table_rows(FIG.read_block(README, "ladder"))[0][0] == "candidate"
    assert (ROOT / "docs" / "kld-vs-size.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _collected(*args: str) -> int:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    m = re.search(r"^(\d+)(?:/\d+)? tests? collected", out.stdout, re.M)
    assert m, out.stdout[-2000:] + out.stderr[-2000:]
    return int(m.group(1))


def test_main_job_case_count_is_what_the_readme_says() -> None:
    shown = FIG.counts(FIG.read_block(README, "main-job"))
    assert sum(v for k, v in shown.items() if k != "deselected") == _collected("fidelity.toml")


@pytest.mark.slow  # collects the whole test suite (~20 s)
def test_quick_tier_count_is_what_the_readme_says() -> None:
    shown = FIG.counts(FIG.read_block(README, "quick-tier"))
    assert sum(v for k, v in shown.items() if k != "deselected") == _collected("-m", "not slow")


def cells_agree(shown: str, now: str, column: str, rel: float = FIG.REL_TOL) -> str | None:
    """None when two ladder cells agree (text exactly, numbers within the stated tolerance), else why not."""
    if NUMBER.sub("#", shown) != NUMBER.sub("#", now):
        return f"{column}: {shown!r} vs {now!r}"
    for a, b in zip(NUMBER.findall(shown), NUMBER.findall(now)):
        x, y = float(a), float(b)
        if column.startswith("top-1"):
            ok = abs(x - y) <= FIG.TOP1_ABS_TOL
        elif column.startswith(("size", "shards")):
            ok = a == b
        else:  # a bin edge moves by one bin (40 a decade) at most; a mean or interval end by REL_TOL
            tol = rel if not shown.startswith("≤") else 10 ** (1 / 40) - 1 + rel
            ok = abs(x - y) <= tol * max(abs(x), abs(y))
        if not ok:
            return f"{column}: {shown!r} vs {now!r}"
    return None


def test_cells_agree_within_the_stated_tolerances() -> None:
    assert cells_agree("1.161e-04 [1.122e-04, 1.210e-04]", "1.170e-04 [1.122e-04, 1.215e-04]", "mean KLD") is None
    assert cells_agree("1.161e-04 [1.122e-04, 1.210e-04]", "1.261e-04 [1.122e-04, 1.210e-04]", "mean KLD")
    assert cells_agree("2.569e-03", "2.353e-03", "mean KLD", FIG.VLLM_REL_TOL) is None  # measured between two runs
    assert cells_agree("≤ 6.310e-04", "≤ 6.683e-04", "p99 (bin)") is None  # the next bin
    assert cells_agree("≤ 6.310e-04", "≤ 7.499e-04", "p99 (bin)")  # three bins away
    assert cells_agree("0.9911", "0.9905", "top-1") is None and cells_agree("0.9911", "0.9811", "top-1")
    assert cells_agree("1.77 MiB", "1.78 MiB", "size") and cells_agree("pass", "FAIL", "baseline")


@pytest.mark.slow  # the embedded default's ladder without pytest; its captures are shared with the main job's cache
def test_ladder_is_what_the_current_code_prints(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "harness", "ladder", "fidelity.toml", "--quiet", "--out",
                          str(tmp_path / "reports")], cwd=ROOT, capture_output=True, text=True, check=False)
    ladder = tmp_path / "reports" / "ladder.md"
    assert ladder.is_file(), out.stdout[-3000:] + out.stderr[-3000:]
    now = FIG.table_rows(ladder.read_text("utf-8"))
    shown = FIG.table_rows(FIG.read_block(README, "ladder"))
    # The README shows the pytest main job's ladder; `fidelity ladder` does not measure the precision floor, so its
    # table has every column of the README's but the floor ratio.
    keep = [i for i, col in enumerate(shown[0]) if col != "× floor"]
    shown = [[r[i] for i in keep] for r in shown]
    assert shown[0] == now[0]  # the columns
    rows_now = {r[0]: r for r in now[1:]}
    rows_shown = {r[0]: r for r in shown[1:]}
    # A README row absent now is a candidate whose engine is not installed here (its cases skip).
    for name in set(rows_shown) - set(rows_now):
        assert name.endswith(".vllm") and importlib.util.find_spec("vllm") is None, name
    assert set(rows_now) <= set(rows_shown), set(rows_now) - set(rows_shown)
    bad = [f"{name}: {why}" for name, row in rows_now.items()
           for col, a, b in zip(now[0], rows_shown[name], row)
           if (why := cells_agree(a, b, col, FIG.VLLM_REL_TOL if name.endswith(".vllm") else FIG.REL_TOL))]
    assert not bad, bad
