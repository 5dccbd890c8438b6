"""The publishable set (``fidelity publish`` / ``fidelity verify``) and ``fidelity paired`` on stores,
from one full pytester run of the tiny project (fidelity, tails, window and paired cases)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.cli.main import main

pytestmark = pytest.mark.slow  # a full tiny-project run through pytester, then publish


@pytest.fixture
def run(pytester: pytest.Pytester, fidelity_project: Path) -> Path:
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    pytester.runpytest("-p", "no:cacheprovider", "--fidelity-update-baselines", "--fidelity-report-dir", "reports").assert_outcomes(
        passed=13, skipped=1)
    return pytester.path


def test_publish_then_verify_refuses_tampering(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run / "pub"
    assert main(["publish", "--reports", str(run / "reports"), "--out", str(out), "--config", str(run / "fidelity.toml"),
                 "--complete", "4"]) == 0
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["README.md", "bad/report.md", "checksums.txt", "good/report.md", "kld-vs-size.json", "kld-vs-size.png",
                     "ladder.md", "results.json", "tails.png"]
    results = json.loads((out / "results.json").read_text())
    good = results["candidates"]["good"]
    assert len(good["shards"]) == 4 and good["tails"]["cumulative"]["n_positions"] == 248
    pair = results["paired"][0]
    # the verdict follows from the published interval and margin by the documented rule (re-stated here):
    # equivalent when the interval lies within ±margin, else "A better" / "B better" when it excludes 0 on one side
    lo, hi = pair["kld_mean"]["ci95"]
    m = pair["margin"]
    expected = ("equivalent" if -m <= lo and hi <= m else "A better" if hi < 0 else "B better" if lo > 0 else "inconclusive")
    assert pair["verdict"] == expected and pair["certifiable_margin"] == max(-lo, hi)
    # the interval holds the difference of the two candidates' means from their own published aggregates
    diff = results["candidates"]["good"]["aggregate"]["kld"]["mean"] - results["candidates"]["bad"]["aggregate"]["kld"]["mean"]
    assert pair["kld_mean"]["diff"] == pytest.approx(diff, rel=1e-9) and lo <= diff <= hi
    assert results["window"]["verdict"]
    pts = json.loads((out / "kld-vs-size.json").read_text())["points"]
    assert {p["candidate"] for p in pts} == {"good", "bad"} and all(p["size_gib"] > 0 for p in pts)
    page = (out / "good" / "report.md").read_text()
    for section in ("**Mean KLD", "## Tails", "## Scoring-window control", "## Paired comparisons", "## Identity",
                    "## How to reproduce",
                    "pytest fidelity.toml --fidelity-candidates good --fidelity-shards 0,1,2,3"):
        assert section in page, section
    lines = (out / "checksums.txt").read_text().splitlines()
    assert len(lines) == 8 and all(len(l.split("  ")[0]) == 64 for l in lines)  # sha256sum format
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    assert "OK (8 files" in capsys.readouterr().out
    # changed
    ladder = out / "ladder.md"
    original = ladder.read_bytes()
    ladder.write_bytes(original.replace(b"good", b"g00d"))
    assert main(["verify", str(out)]) == 1
    assert "ladder.md: sha256: expected" in capsys.readouterr().err
    ladder.write_bytes(original)
    # missing
    page_path = out / "bad" / "report.md"
    page_text = page_path.read_bytes()
    page_path.unlink()
    assert main(["verify", str(out)]) == 1
    assert "bad/report.md: missing" in capsys.readouterr().err
    page_path.write_bytes(page_text)
    # extra
    (out / "notes.txt").write_text("added later")
    assert main(["verify", str(out)]) == 1
    assert "notes.txt: extra file" in capsys.readouterr().err
    (out / "notes.txt").unlink()
    assert main(["verify", str(out)]) == 0
    # publishing over an existing set is refused
    assert main(["publish", "--reports", str(run / "reports"), "--out", str(out)]) == 2


def test_paired_cli_on_stores_matches_the_pytest_case(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    caps = run / ".fidelity-cache" / "captures"
    good, bad = (next(caps.glob(f"{n}-*")) for n in ("good", "bad"))
    assert main(["paired", str(good), str(bad), "--name-a", "good", "--name-b", "bad", "--suite", str(run / "suite"),
                 "--reference", str(run / "reference"), "--head", str(run / "lm_head.safetensors"),
                 "--config", str(run / "fidelity.toml"), "--n-boot", "500", "--out", str(run / "cli")]) == 0
    assert "good vs bad:" in capsys.readouterr().out
    cli = json.loads((run / "cli" / "paired" / "good-vs-bad.json").read_text())
    case = json.loads((run / "reports" / "paired" / "good-vs-bad.json").read_text())
    assert cli["kld_mean"] == case["kld_mean"] and cli["verdict"] == case["verdict"] and cli["margin"] == 0.001
    assert main(["paired", str(good), str(bad), "--suite", str(run / "suite"), "--reference", str(run / "reference"),
                 "--head", str(run / "lm_head.safetensors"), "--out", str(run / "cli2")]) == 2
    assert "no equivalence margin" in capsys.readouterr().err
