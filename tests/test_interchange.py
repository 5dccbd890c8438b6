"""The published fidelity-suite layout: written from the embedded default by this project's writer,
read in place, scored through ``fidelity replay --dataset`` and through pytest with the numbers the
project gets on its own suite; every published digest checked; one broken thing at a time refused."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures"


@pytest.fixture(scope="module")
def pub(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """int8 captured and replayed on shard 0 in the project, then the suite, the reference of shards
    0 and 1, the int8 capture and its report written in the published layout."""
    tmp = tmp_path_factory.mktemp("pub")
    for name in ("int8", "int4_g32"):
        assert main(["capture", "--model", str(FIX / "candidates" / name), "--suite", str(FIX / "suite"),
                     "--out", str(tmp / "cap" / name), "--shards", "0", "--quiet"]) == 0
        assert main(["replay", "--suite", str(FIX / "suite"), "--reference", str(FIX / "reference"), "--candidate",
                     str(tmp / "cap" / name), "--head", str(FIX / "lm_head.safetensors"), "--shards", "0",
                     "--name", name, "--reference-name", "bf16", "--out", str(tmp / "reports" / name)]) == 0
    assert main(["dataset", "write-published", "--config", str(ROOT / "fidelity.toml"), "--reference-shards", "0,1",
                 "--capture", f"int8={tmp / 'cap' / 'int8'}", "--reports", str(tmp / "reports"), "--out", str(tmp / "v")]) == 0
    return tmp, tmp / "v"


def _ours(tmp: Path) -> dict:
    return json.loads((tmp / "reports" / "int8" / "shard-00.json").read_text())


def test_layout_written_as_published(pub: tuple[Path, Path]) -> None:
    """Token files hash as json.dumps(ids); the parent digest chains them; views are slices (independent hashing)."""
    _tmp, v = pub
    tokens = np.load(FIX / "suite" / "tokens.npy")
    digests = [hashlib.sha256(json.dumps([int(t) for t in row]).encode()).hexdigest() for row in tokens]
    parent = json.loads((v / "suite" / "suite-manifest.json").read_text())
    assert parent["suite_token_sha256"] == hashlib.sha256("".join(digests).encode()).hexdigest()
    assert json.loads((v / "suite" / "tokens" / "context-0005.json").read_text()) == [int(t) for t in tokens[5]]
    view = json.loads((v / "suite" / "shard-0001" / "suite-manifest.json").read_text())
    assert view["context_index"] == parent["context_index"][16:32]
    assert view["suite_token_sha256"] == hashlib.sha256("".join(digests[16:32]).encode()).hexdigest()
    ref = json.loads((v / "reference" / "hidden-bf16" / "capture-manifest.json").read_text())
    assert ref["complete"] is True and ref["suite_token_sha256"] == hashlib.sha256("".join(digests[:16]).encode()).hexdigest()
    rep = json.loads((v / "reports" / "fidelity" / "shard-0000" / "report-int8.json").read_text())
    assert rep["schema"] == "qwen38-fidelity-report/2" and rep["token_mean_kld"] == _ours(_tmp)["metrics"]["kld"]["mean"]
    assert sum(rep["kld_tail"]["counts"]) == rep["scored_positions"] == 16 * 255


@pytest.mark.parametrize("which", ["project store", "published capture folder", "model folder"])
def test_replay_equals_the_project(pub: tuple[Path, Path], which: str) -> None:
    tmp, v = pub
    cand = {"project store": tmp / "cap" / "int8", "published capture folder": v / "captures" / "shard-0000" / "hidden-int8",
            "model folder": FIX / "candidates" / "int8"}[which]
    out = tmp / f"replayed-{which.split()[0]}"
    shards = ["--shards", "0"] if which == "model folder" else []  # a model is captured on the shards asked for
    assert main(["replay", "--dataset", str(v), "--candidate", str(cand), "--name", "int8", *shards, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.json")) == ["shard-00.json"]  # the stores cover shard 0 only
    mine = json.loads((out / "shard-00.json").read_text())
    assert mine["metrics"] == _ours(tmp)["metrics"]
    custody = mine["comparability"]["custody"]
    parent = json.loads((v / "suite" / "suite-manifest.json").read_text())
    assert custody["layout"] == "qwen38-fidelity-suite"
    assert custody["suite_token_sha256"] == parent["suite_token_sha256"]
    assert custody["head_sha256"] == hashlib.sha256((v / "lm-head" / "weight.safetensors").read_bytes()).hexdigest()
    assert custody["reference"]["hidden-bf16"]["capture_manifest_sha256"] == hashlib.sha256(
        (v / "reference" / "hidden-bf16" / "capture-manifest.json").read_bytes()).hexdigest()


@pytest.mark.slow
def test_pytest_scores_a_published_dataset(pub: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, v = pub
    (tmp_path / "my.toml").write_text(
        f'[dataset]\npath = "{v}"\n\n[settings]\nbaselines = "baselines"\n\n'
        f'[[candidates]]\nname = "int8"\nstore = "{tmp / "cap" / "int8"}"\n\n'
        f'[[candidates]]\nname = "int8_published"\nstore = "{v / "captures" / "shard-0000" / "hidden-int8"}"\n\n'
        f'[[pairs]]\na = "int8"\nb = "int8_published"\nmargin = 0.0005\nexpect = "equivalent"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "my.toml", "--fidelity-update-baselines", "-p", "no:cacheprovider",
                          "--fidelity-shards", "0", "-m", "fidelity or fidelity_paired"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "layout qwen38-fidelity-suite" in run.stdout
    for name in ("int8", "int8_published"):  # the dataset's own capture folder is a candidate too
        mine = json.loads((tmp_path / "fidelity-reports" / name / "shard-00.json").read_text())
        assert mine["metrics"] == _ours(tmp)["metrics"]
        assert mine["comparability"]["custody"]["layout"] == "qwen38-fidelity-suite"
    pair = json.loads((tmp_path / "fidelity-reports" / "paired" / "int8-vs-int8_published.json").read_text())
    assert pair["kld_mean"]["diff"] == 0.0


def _rewrite_capture(folder: Path, index: int, tensor: object) -> None:
    """Replace one hidden file and fix its manifest record (a consistent but wrong capture)."""
    from safetensors.torch import save

    data = save({"hidden_states": tensor})
    (folder / f"hidden_{index:04d}.safetensors").write_bytes(data)
    mf = folder / "capture-manifest.json"
    doc = json.loads(mf.read_text())
    for rec in doc["captures"]:
        if rec["index"] == index:
            rec["sha256"] = hashlib.sha256(data).hexdigest()
            rec["shape"] = list(tensor.shape)  # type: ignore[attr-defined]
    mf.write_text(json.dumps(doc, indent=2))


def _break(v: Path, what: str) -> str:
    """Break one thing in the copy ``v``; returns the expected refusal text."""
    import torch

    if what == "token digest":
        p = v / "suite" / "tokens" / "context-0003.json"
        ids = json.loads(p.read_text())
        ids[7] = ids[7] + 1
        p.write_text(json.dumps(ids))
        return "context-0003.json: token_sha256 (sha256 of json.dumps(ids))"
    if what == "view not a slice":
        mf = v / "suite" / "shard-0001" / "suite-manifest.json"
        doc = json.loads(mf.read_text())
        doc["context_index"][2], doc["context_index"][3] = doc["context_index"][3], doc["context_index"][2]
        mf.write_text(json.dumps(doc, indent=2))
        return "shard-0001/suite-manifest.json: suite_token_sha256"
    if what == "view edited consistently":
        mf = v / "suite" / "shard-0001" / "suite-manifest.json"
        doc = json.loads(mf.read_text())
        doc["context_index"][2]["source_cluster"] = "elsewhere"
        mf.write_text(json.dumps(doc, indent=2))
        return "shard view rows (a slice of the parent suite, contexts 16..31)"
    ref = v / "reference" / "hidden-bf16"
    if what == "reference rows":
        _rewrite_capture(ref, 4, torch.zeros(254, 128, dtype=torch.bfloat16))
        return "captures[4].shape rows (context_length - 1): expected 255, found 254"
    if what == "reference width":
        for i in range(16):
            _rewrite_capture(ref, i, torch.zeros(255, 96, dtype=torch.bfloat16))
        other = v / "reference" / "hidden-bf16-shard-0001"
        for i in range(16, 32):
            _rewrite_capture(other, i, torch.zeros(255, 96, dtype=torch.bfloat16))
        return "head hidden_size (the reference's hidden size): expected 96, found 128"
    if what == "reference byte":
        p = ref / "hidden_0002.safetensors"
        data = bytearray(p.read_bytes())
        data[-3] ^= 0x01
        p.write_bytes(bytes(data))
        return "hidden_0002.safetensors: sha256 (capture-manifest.json)"
    if what == "incomplete reference":
        mf = ref / "capture-manifest.json"
        doc = json.loads(mf.read_text())
        doc["complete"] = False
        mf.write_text(json.dumps(doc))
        return "capture-manifest.json: complete: expected True, found False"
    if what == "head not pinned":
        p = v / "lm-head" / "weight.safetensors"
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0x01
        p.write_bytes(bytes(data))
        return "weight.safetensors: sha256 (the head pinned by suite/ladder-pin.json)"
    raise AssertionError(what)


@pytest.mark.parametrize("what", ["token digest", "view not a slice", "view edited consistently", "reference rows",
                                  "reference width", "reference byte", "incomplete reference", "head not pinned"])
def test_refusals(pub: tuple[Path, Path], tmp_path: Path, what: str, capsys: pytest.CaptureFixture[str]) -> None:
    tmp, v = pub
    copy = tmp_path / "v"
    shutil.copytree(v, copy)
    expected = _break(copy, what)
    capsys.readouterr()
    assert main(["replay", "--dataset", str(copy), "--candidate", str(tmp / "cap" / "int8"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert expected in err, err
    assert not (tmp_path / "out").exists()


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to the nearest bf16 (ties to even) via float32 bits, returned as float64."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def _published_method_float64(v: Path) -> tuple[list[float], list[float], list[str]]:
    """The published method re-derived in float64 numpy from the layout's own files: per-context mean KLD and top-1."""
    import torch
    from safetensors.torch import load_file

    head = next(iter(load_file(v / "lm-head" / "weight.safetensors").values())).to(torch.float64).numpy()
    parent = json.loads((v / "suite" / "shard-0000" / "suite-manifest.json").read_text())
    means, top1, clusters = [], [], []
    for row in parent["context_index"]:
        name = f"hidden_{row['index']:04d}.safetensors"
        ref = load_file(v / "reference" / "hidden-bf16" / name)["hidden_states"].to(torch.float64).numpy()
        cand = load_file(v / "captures" / "shard-0000" / "hidden-int8" / name)["hidden_states"].to(torch.float64).numpy()
        lr, lc = _bf16(ref @ head.T), _bf16(cand @ head.T)
        lr -= np.log(np.exp(lr - lr.max(1, keepdims=True)).sum(1, keepdims=True)) + lr.max(1, keepdims=True)
        lc -= np.log(np.exp(lc - lc.max(1, keepdims=True)).sum(1, keepdims=True)) + lc.max(1, keepdims=True)
        kl = (np.exp(lr) * (lr - lc)).sum(1)
        means.append(float(kl.mean()))
        top1.append(float((lr.argmax(1) == lc.argmax(1)).mean()))
        clusters.append(row["source_cluster"])
    return means, top1, clusters


def _flattened_bootstrap(values: list[float], clusters: list[str]) -> tuple[float, float]:
    """The percentile bootstrap as the published description states it (flattened context means)."""
    import random

    by: dict[str, list[float]] = {}
    for x, c in zip(values, clusters):
        by.setdefault(c, []).append(x)
    keys, rng, reps = list(by), random.Random(1), []
    for _ in range(10_000):
        flat = [x for k in (keys[rng.randrange(len(keys))] for _ in keys) for x in by[k]]
        reps.append(sum(flat) / len(flat))
    reps.sort()
    return reps[250], reps[9749]


def test_published_method_against_float64(pub: tuple[Path, Path]) -> None:
    """--method published: the published tool's figures, checked against an independent float64 re-implementation;
    the exact figure and the difference stand beside them; never aggregated with exact figures."""
    tmp, v = pub
    out = tmp / "method"
    assert main(["replay", "--dataset", str(v), "--candidate", str(v / "captures" / "shard-0000" / "hidden-int8"),
                 "--name", "int8", "--method", "published", "--out", str(out)]) == 0
    doc = json.loads((out / "report-int8-shard-0000.json").read_text())
    assert doc["schema"] == "qwen38-fidelity-report/2" and doc["fidelity_method"]["name"] == "published"
    means, top1, clusters = _published_method_float64(v)
    got = [r["mean_kld"] for r in doc["per_context"]]
    assert np.allclose(got, means, rtol=2e-3, atol=0)  # bf16 rounding flips at a few logits
    assert doc["token_mean_kld"] == pytest.approx(float(np.mean(means)), rel=1e-4)
    assert doc["top1_agreement"] == pytest.approx(float(np.mean(top1)), abs=2 / 4080)
    lo, hi = _flattened_bootstrap(got, [r["source_cluster"] for r in doc["per_context"]])
    assert doc["context_bootstrap"]["ci95_low"] == pytest.approx(lo, rel=1e-12)
    assert doc["context_bootstrap"]["ci95_high"] == pytest.approx(hi, rel=1e-12)
    exact = _ours(tmp)["metrics"]["kld"]["mean"]
    assert doc["fidelity_method"]["exact"]["token_mean_kld"] == exact
    assert doc["fidelity_method"]["difference"]["token_mean_kld"] == pytest.approx(doc["token_mean_kld"] - exact, rel=1e-12)
    assert doc["token_mean_kld"] > 1.3 * exact  # the bf16 rounding of every logit biases the mean upward
    md = (out / "report-int8-shard-0000.md").read_text()
    assert "published method (not this project's measurement)" in md and "exact (this project)" in md
    assert main(["aggregate", str(out / "report-int8-shard-0000.json"), "--suite", str(FIX / "suite"),
                 "--out", str(tmp / "agg-method")]) == 0  # alone, aggregated and labelled as what it is
    assert json.loads((tmp / "agg-method" / "published-aggregate.json").read_text())["method"] == "published"
    assert main(["aggregate", str(out / "report-int8-shard-0000.json"), str(v / "reports" / "fidelity"),
                 "--suite", str(FIX / "suite"), "--out", str(tmp / "agg-mixed")]) == 1  # never beside exact figures
    assert not (tmp / "agg-mixed").exists()


def test_published_reports_aggregate_and_pair(pub: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """aggregate / paired read the published reports' per-context rows: the project's exact numbers come back;
    a report of another suite and a mix of methods are refused."""
    tmp, v = pub
    reps = v / "reports" / "fidelity" / "shard-0000"
    assert main(["aggregate", str(reps / "report-int8.json"), "--suite", str(v / "suite"), "--out", str(tmp_path / "agg")]) == 0
    agg = json.loads((tmp_path / "agg" / "published-aggregate.json").read_text())
    ours = _ours(tmp)["metrics"]
    assert agg["token_mean_kld"] == pytest.approx(ours["kld"]["mean"], rel=1e-12)
    assert agg["top1_agreement"] == pytest.approx(ours["top1"]["agreement"], rel=1e-12)
    assert agg["kld_tail"]["counts"] == ours["histogram"]["counts"] and agg["method"] == "exact"
    assert main(["paired", str(reps / "report-int8.json"), str(reps / "report-int4_g32.json"), "--suite", str(v / "suite"),
                 "--name-a", "int8", "--name-b", "int4_g32", "--out", str(tmp_path / "p")]) == 0
    pair = json.loads((tmp_path / "p" / "paired" / "int8-vs-int4_g32.published.json").read_text())
    a = {r["index"]: r for r in _ours(tmp)["metrics"]["contexts"]}
    b = {r["index"]: r for r in json.loads((tmp / "reports" / "int4_g32" / "shard-00.json").read_text())["metrics"]["contexts"]}
    diffs = [a[i]["mean_kld"] - b[i]["mean_kld"] for i in sorted(a)]
    assert pair["difference_a_minus_b"] == pytest.approx(float(np.mean(diffs)), rel=1e-12)
    lo, hi = _flattened_bootstrap(diffs, [str(a[i]["cluster"]) for i in sorted(a)])
    assert (pair["ci95_low"], pair["ci95_high"]) == (pytest.approx(lo, rel=1e-9), pytest.approx(hi, rel=1e-9))
    assert pair["b_wins"] == 0 and pair["a_wins"] == 16  # int8 is closer to the reference on every context
    other = tmp_path / "other.json"
    doc = json.loads((reps / "report-int8.json").read_text())
    doc["suite_token_sha256"] = hashlib.sha256(b"another suite").hexdigest()
    other.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["aggregate", str(other), "--suite", str(v / "suite"), "--out", str(tmp_path / "no")]) == 1
    assert "a report of another suite" in capsys.readouterr().err
    method = tmp / "method" / "report-int8-shard-0000.json"
    if method.is_file():  # written by the method test of this module
        assert main(["paired", str(method), str(reps / "report-int4_g32.json"), "--out", str(tmp_path / "no")]) == 1
        assert "method (fidelity_method.name" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_results_json_ladder(pub: tuple[Path, Path], tmp_path: Path) -> None:
    """aggregate --results-json: one entry per candidate (size, mean KLD, top-1, how to re-measure), best first."""
    tmp, _v = pub
    assert main(["aggregate", str(tmp / "reports"), "--suite", str(FIX / "suite"), "--partial", "--out", str(tmp_path / "agg"),
                 "--results-json", str(tmp_path / "results.json")]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["schema"] == "fidelity.kld-results/1" and doc["command"].startswith("fidelity aggregate")
    assert [e["name"] for e in doc["entries"]] == ["int8", "int4_g32"]
    for e in doc["entries"]:
        shard = json.loads((tmp / "reports" / e["name"] / "shard-00.json").read_text())["metrics"]
        assert e["mean_kld"] == pytest.approx(shard["kld"]["mean"], rel=1e-12)
        assert e["top1"] == pytest.approx(shard["top1"]["agreement"], rel=1e-12)
        assert e["n_positions"] == 16 * 255 and e["shards"] == [0] and e["name"] in e["command"]


def test_windowed_method_report_is_a_3(pub: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--window with the published method: a qwen38-fidelity-report/3 over the retained rows, never paired with a /2."""
    _tmp, v = pub
    cap = v / "captures" / "shard-0000" / "hidden-int8"
    assert main(["replay", "--dataset", str(v), "--candidate", str(cap), "--name", "int8", "--method", "published",
                 "--window", "128", "--out", str(tmp_path / "w.json")]) == 0
    doc = json.loads((tmp_path / "w.json").read_text())
    assert doc["schema"] == "qwen38-fidelity-report/3" and doc["scored_position_window"]["score_from"] == 128
    assert doc["scored_positions"] == 16 * (255 - 128) == sum(doc["kld_tail"]["counts"])
    assert main(["replay", "--dataset", str(v), "--candidate", str(cap), "--name", "int8", "--method", "published",
                 "--out", str(tmp_path / "full.json")]) == 0
    capsys.readouterr()
    assert main(["paired", str(tmp_path / "w.json"), str(tmp_path / "full.json"), "--out", str(tmp_path / "no")]) == 1
    assert "scored_position_window.score_from" in capsys.readouterr().err
