"""benchmarks/compare_reports.py: two report folders that differ only in timing, creation, run ids and
paths compare identical; a changed number, line, binary byte or missing file is a difference."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_reports.py"


@pytest.fixture(scope="module")
def cr() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compare_reports", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["compare_reports"] = mod
    spec.loader.exec_module(mod)
    return mod


def _folder(base: Path, name: str, *, total_s: float, created: str, run: str, mean: float = 0.0123,
            footer_line: str = "| int8 | 0.0123 |", scores: str = "scored") -> Path:
    """A small report folder as a run writes one: a shard report, its Markdown and the ledger."""
    root = base / f"{name}-checkout"
    out = base / f"{name}-reports"
    (out / "int8").mkdir(parents=True)
    shard = {"candidate": "int8", "kld": {"mean": mean}, "created": created,
             "timing": {"device": "cpu", "total_s": total_s, "score_s": total_s / 3, "scores": scores},
             "head": {"path": f"{root}/fixtures/lm_head.safetensors"}}
    (out / "int8" / "shard-00.json").write_text(json.dumps(shard, indent=1))
    (out / "int8" / "shard-00.md").write_text(f"| candidate | mean |\n|---|---|\n{footer_line}\n\n"
                                              f"Timing: device cpu, score_s {total_s / 3:.4g}, scores {scores}, total_s {total_s:.4g}.\n"
                                              f"Schema fidelity.shard-report/1; created {created}.\n")
    (out / "tails.png").write_bytes(b"\x89PNG\x00\x01")
    ledger = {"schema": "fidelity.report-dir/3", "config": f"{root}/fidelity.toml", "latest_run": run,
              "runs": {run: {"finished": created, "command": f"pytest fidelity.toml --fidelity-report-dir {out}"}},
              "files": {"int8/shard-00.json": {"run": run, "sha256": run * 4}}, "folders": []}
    (out / "fidelity-run.json").write_text(json.dumps(ledger))
    return out


def test_only_timing_creation_run_and_path_fields_differ(cr: ModuleType, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    old = _folder(tmp_path, "old", total_s=4.5, created="2026-12-02T03:17:50+00:00", run="7502c93b2145")
    new = _folder(tmp_path, "new", total_s=9.25, created="2026-12-02T05:01:02+00:00", run="0123456789ab",
                  scores="cache")
    assert cr.compare(old, new) == []
    assert cr.main([str(old), str(new)]) == 0
    assert "identical: 4 files" in capsys.readouterr().out


@pytest.mark.parametrize(("change", "where"), [
    ({"mean": 0.0124}, "int8/shard-00.json: /kld/mean: 0.0123 -> 0.0124"),
    ({"footer_line": "| int8 | 0.0124 |"}, "int8/shard-00.md: line 3: '| int8 | 0.0123 |' -> '| int8 | 0.0124 |'"),
    ({"footer_line": "| int8 | 0.0123 | 1 |"}, "int8/shard-00.md: line 3: '| int8 | 0.0123 |' -> '| int8 | 0.0123 | 1 |'"),
])
def test_a_number_is_a_difference(cr: ModuleType, tmp_path: Path, change: dict[str, object], where: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    old = _folder(tmp_path, "old", total_s=4.5, created="2026-12-02T03:17:50+00:00", run="7502c93b2145")
    new = _folder(tmp_path, "new", total_s=4.5, created="2026-12-02T03:17:50+00:00", run="7502c93b2145",
                  **change)  # type: ignore[arg-type]
    assert cr.compare(old, new) == [where]
    assert cr.main([str(old), str(new)]) == 1
    assert where in capsys.readouterr().out


def test_a_binary_byte_or_a_missing_file_is_a_difference(cr: ModuleType, tmp_path: Path) -> None:
    old = _folder(tmp_path, "old", total_s=4.5, created="2026-12-02T03:17:50+00:00", run="7502c93b2145")
    new = _folder(tmp_path, "new", total_s=4.5, created="2026-12-02T03:17:50+00:00", run="7502c93b2145")
    (new / "tails.png").write_bytes(b"\x89PNG\x00\x02")
    (new / "int8" / "shard-00.md").unlink()
    assert cr.compare(old, new) == [f"int8/shard-00.md: only in {old}",
                                    "tails.png: binary files differ (6 bytes -> 6 bytes)"]
    assert cr.main([str(old), str(tmp_path / "missing")]) == 2
