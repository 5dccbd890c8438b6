"""One candidate that cannot load, in a whole ladder run of the tiny project (shards, tails, windows, pair):

* it appears with its status and reason in every summary of the run (terminal, ``ladder.md`` / ``ladder.json``,
  the GitHub job summary, junit XML), of the published set (``results.json``, ``ladder.md``, the model card;
  the set still verifies) of ``fidelity aggregate`` (its ``ladder.md`` and ``--results-json``) and of ``fidelity dataset build``
  (``dataset.json`` and the dataset card);
* every other case is unaffected: the other candidates' numbers are identical to those of the same ladder
  without it (captured and scored afresh in a copy of the project);
* each model is loaded once per run: the engine's load is counted per model folder (the broken one's failed
  attempt included), and the reference (its store exists) is never loaded."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # two ladder runs of the tiny project, captured afresh

BROKEN = '''
[[candidates]]
name = "broken"
model = "models/broken"
'''


def _ladder_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, project: Path, folder: str,
                broken: bool) -> tuple[Path, Counter[str], pytest.RunResult]:
    """A fresh copy of the tiny project (with the broken candidate or without), its whole ladder run in
    process, counting the engine's model loads per model folder."""
    import harness.engines.transformers as tf

    root = pytester.path / folder
    shutil.copytree(project, root)
    if broken:
        shutil.copytree(root / "models" / "good", root / "models" / "broken")
        import numpy as np
        from safetensors.numpy import save_file

        for f in (root / "models" / "broken").glob("*.safetensors"):
            f.unlink()
        save_file({"unrelated": np.zeros(2, dtype=np.float32)}, str(root / "models" / "broken" / "model.safetensors"))
        (root / "fidelity.toml").write_text((root / "fidelity.toml").read_text() + BROKEN)
    loads: Counter[str] = Counter()
    real = tf.TransformersEngine.load

    def counting(self: Any, model: Path, *args: Any, **kw: Any) -> Any:
        loads[Path(model).name] += 1
        return real(self, model, *args, **kw)

    monkeypatch.setattr(tf.TransformersEngine, "load", counting)
    monkeypatch.chdir(root)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(root / "summary.md"))
    result = pytester.runpytest(str(root / "fidelity.toml"), "--rootdir", str(root), "-p", "no:cacheprovider",
                                "--fidelity-update-baselines", "--junitxml", str(root / "junit.xml"))
    monkeypatch.undo()
    return root, loads, result


def _numbers(root: Path, name: str) -> dict[str, Any]:
    """Every number of one candidate in a run's report folder: its shard reports' metrics, its ladder row's
    figures and verdict, its tails entry, the pair's figures."""
    rep = root / "fidelity-reports"
    shards = {p.name: json.loads(p.read_text())["metrics"] for p in sorted((rep / name).glob("shard-*.json"))}
    row = next(r for r in json.loads((rep / "ladder.json").read_text())["rows"] if r["candidate"] == name)
    tails = next(t for t in json.loads((rep / "tails.json").read_text())["candidates"] if t["candidate"] == name)
    pair = json.loads(next((rep / "paired").glob("*.json")).read_text())
    figures = {k: row[k] for k in ("mean_kld", "ci95", "top1", "n_positions", "verdict", "shards")}
    keep = {k: v for k, v in pair.items() if isinstance(v, (int, float, list)) or k in ("verdict",)}
    return {"shards": shards, "row": figures, "tails": {k: v for k, v in tails.items() if k != "timing"}, "pair": keep}


def test_unloadable_candidate_is_in_every_summary_and_changes_nothing_else(
        pytester: pytest.Pytester, fidelity_project: Path, monkeypatch: pytest.MonkeyPatch, tiny_corpus: Path,
        tiny_tokenizer: Path) -> None:
    from harness.cli.main import main

    clean, clean_loads, _ = _ladder_run(pytester, monkeypatch, fidelity_project, "clean", broken=False)
    root, loads, result = _ladder_run(pytester, monkeypatch, fidelity_project, "with-broken", broken=True)

    # loads: each model once per run (the broken one's single failed attempt included); the reference never
    assert dict(clean_loads) == {"good": 1, "bad": 1}
    assert dict(loads) == {"good": 1, "bad": 1, "broken": 1}

    # every other case unaffected: identical numbers, and only the broken candidate's cases fail
    for name in ("good", "bad"):
        assert _numbers(root, name) == _numbers(clean, name), name
    outcomes = result.parseoutcomes()
    assert "broken" in result.stdout.str() and outcomes.get("failed", 0) + outcomes.get("errors", 0) >= 1
    failed_ids = [ln for ln in result.stdout.lines if ln.startswith(("FAILED", "ERROR"))]
    assert failed_ids and all("broken" in ln for ln in failed_ids), failed_ids

    # every summary of the run names it with status and reason
    reason = "transformers could not interpret the checkpoint fully"
    result.stdout.fnmatch_lines([f"not in the ladder: broken: failed: *{reason}*"])
    rep = root / "fidelity-reports"
    (entry,) = json.loads((rep / "ladder.json").read_text())["not_measured"]
    assert entry["candidate"] == "broken" and entry["status"] == "failed" and reason in entry["reason"]
    assert "- `broken`: failed: " in (rep / "ladder.md").read_text()
    summary = (root / "summary.md").read_text()
    assert "- not in the ladder: `broken`: failed: " in summary and reason in summary
    props = {p.get("name"): p.get("value") for p in ET.parse(root / "junit.xml").getroot().iter("property")}
    assert props["broken:not_measured"].startswith("failed: ") and reason in props["broken:not_measured"]

    # the published set: results.json, ladder.md and the model card name it; the set verifies; the other
    # candidates' published numbers equal those of the ladder without it
    sets = {}
    for base in (clean, root):
        out = base / "published"
        assert main(["publish", "--reports", str(base / "fidelity-reports"), "--out", str(out),
                     "--config", str(base / "fidelity.toml")]) == 0
        assert main(["verify", str(out)]) == 0
        sets[base] = json.loads((out / "results.json").read_text())
    res = sets[root]
    (pub,) = res["not_measured"]
    assert pub["candidate"] == "broken" and pub["status"] == "failed" and reason in pub["reason"]
    assert sets[clean]["not_measured"] == []
    for page in ("ladder.md", "README.md"):
        text = (root / "published" / page).read_text()
        assert "Configured but not measured" in text and "- `broken`: failed: " in text, page
    for name in ("good", "bad"):
        a, b = sets[clean]["candidates"][name], res["candidates"][name]
        assert a["aggregate"]["kld"] == b["aggregate"]["kld"] and a["verdict"] == b["verdict"], name

    # fidelity aggregate --results-json over the run's report folder: the ladder and results.json name it too
    assert main(["aggregate", str(rep), "--suite", str(root / "suite"), "--out", str(root / "agg"),
                 "--results-json", str(root / "results.json")]) == 0
    (agg,) = json.loads((root / "results.json").read_text())["not_measured"]
    assert agg["candidate"] == "broken" and agg["status"] == "failed" and reason in agg["reason"]
    assert sorted(e["name"] for e in json.loads((root / "results.json").read_text())["entries"]) == ["bad", "good"]
    assert "- `broken`: failed: " in (root / "agg" / "ladder.md").read_text()

    # fidelity dataset build with the run's reports: dataset.json and the dataset card name it
    assert main(["dataset", "build", "--config", str(root / "fidelity.toml"), "--reports", str(rep), "--corpus",
                 str(tiny_corpus), "--tokenizer", str(tiny_tokenizer), "--reference-shards", "0", "--out", str(root / "ds")]) == 0
    (ds,) = json.loads((root / "ds" / "dataset.json").read_text())["not_measured"]
    assert ds["candidate"] == "broken" and ds["status"] == "failed" and reason in ds["reason"]
    assert "- `broken`: failed: " in (root / "ds" / "README.md").read_text()
    assert main(["verify", str(root / "ds")]) == 0
