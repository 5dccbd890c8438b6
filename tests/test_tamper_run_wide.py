"""Run-wide cases (window, tails, paired, the precision floor) never pass over inputs that were refused.

A run whose every candidate's scores were refused (a reference store with two context files swapped)
fails each run-wide case naming the refusal, prints no "passed", and writes no summary over an empty
table; a shard selection a published-layout dataset cannot serve (its reference manifest lost a record)
names the manifest and the missing context. The run-wide summaries a run writes (``adaptive.json``,
``tails.json``, ``paired/*.json``, ``window.json``) are re-derived by ``publish`` and ``verify`` from the
shard reports: one that does not follow is refused by name.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.cli.main import main
from harness.errors import VerificationError

ROOT = Path(__file__).resolve().parents[1]

FLOOR_TEST = '''\
import pytest


@pytest.mark.fidelity_precision_floor(shards="0")
def test_floor(fidelity_precision_floor):
    assert fidelity_precision_floor["kld"]["mean"] >= 0
'''


def test_refused_inputs_fail_every_run_wide_case_and_write_no_summary(tmp_path: Path, fidelity_project: Path) -> None:
    """Shard 0's two reference contexts swapped: the shard, tails, window and paired cases and the precision floor
    test each fail naming the store file and its sha256; nothing passes and the report folder gets no summary."""
    root = tmp_path / "p"
    shutil.copytree(fidelity_project, root, symlinks=True)
    ref = root / "reference"
    a, b = ref / "ctx-000000.safetensors", ref / "ctx-000001.safetensors"
    a_bytes = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(a_bytes)
    (root / "test_floor.py").write_text(FLOOR_TEST)
    run = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "test_floor.py", "-p", "no:cacheprovider",
                          "--fidelity-shards", "0", "--fidelity-report-dir", "reports", "-o", "console_output_style=classic"],
                         cwd=root, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    refusal = f"{a}: sha256: expected"
    for case in ("test_tails[tails-good]", "test_window[window-from0]", "test_paired[pair-good-vs-bad]", "test_floor"):
        line = next((x for x in out.splitlines() if x.startswith(("ERROR", "FAILED")) and case in x), None)
        assert line is not None, f"{case} did not fail:\n{out[-3000:]}"
    assert "window comparison from row 0: expected at least one candidate scored, found none" in out
    assert out.count(refusal) >= 4, out[-3000:]
    assert " passed" not in out.splitlines()[-1], out.splitlines()[-1]
    written = sorted(p.relative_to(root / "reports").as_posix() for p in (root / "reports").rglob("*")) \
        if (root / "reports").exists() else []
    assert not [w for w in written if w.split(".")[0] in ("ladder", "window", "tails", "precision_floor")
                or w.startswith("paired")], written


def test_shard_selection_names_the_manifest_that_lost_a_record(tmp_path: Path, fidelity_project: Path) -> None:
    """A published-layout dataset whose reference manifest lost context 1's record: ``--fidelity-shards 0`` is a usage
    error naming the manifest, the missing context and the shard's contexts, not only the shards held."""
    v = tmp_path / "v"
    assert main(["dataset", "write-published", "--config", str(fidelity_project / "fidelity.toml"),
                 "--reference-shards", "0,1", "--out", str(v)]) == 0
    manifests = sorted((v / "reference").rglob("capture-manifest.json"))
    mf = next(m for m in manifests if any(c["index"] == 1 for c in json.loads(m.read_text())["captures"]))
    doc = json.loads(mf.read_text())
    doc["captures"] = [c for c in doc["captures"] if c["index"] != 1]
    mf.write_text(json.dumps(doc))
    (tmp_path / "my.toml").write_text(f'[dataset]\npath = "{v}"\n\n[settings]\nbaselines = "baselines"\n\n'
                                      f'[[candidates]]\nname = "ref_again"\nstore = "{fidelity_project / "reference"}"\n')
    run = subprocess.run([sys.executable, "-m", "pytest", "my.toml", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "--fidelity-shards", "0"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    err = run.stderr
    assert run.returncode == 4, run.stdout[-2000:] + err
    assert (f"{v / 'reference'}: --fidelity-shards 0: expected shards the dataset holds a reference for (1), found 0 "
            f"(shard 0: {mf} lists no record for context(s) 1 (the shard holds contexts 0..1))") in err, err
    assert "Traceback" not in err


# ----------------------------------------------------------------------------- adaptive.json


def _resealed_verify_output(pub: Path, res: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    """Write a tampered ``results.json`` into the published set ``pub`` and reseal its checksums (so only the
    re-derivation can see the lie); ``fidelity verify`` must then refuse it: its output, for the message check."""
    from harness.cli.main import main
    from harness.reports.report_set import write_checksums

    (pub / "results.json").write_text(json.dumps(res))
    (pub / "checksums.txt").unlink()
    write_checksums(pub)
    capsys.readouterr()
    assert main(["verify", str(pub)]) != 0
    got = capsys.readouterr()
    return got.out + got.err


def _rows(n_clusters: int, shards: int, seed: int) -> dict[int, list[dict[str, Any]]]:
    """Per-shard per-context rows (``cluster``, ``positions``, ``sum_kld``) of one candidate."""
    rng = np.random.default_rng(seed)
    out: dict[int, list[dict[str, Any]]] = {}
    for s in range(shards):
        out[s] = [{"cluster": f"c{s}-{c}", "positions": 31, "sum_kld": float(rng.gamma(2.0, 0.01) * 31)}
                  for c in range(n_clusters)]
    return out


def _adaptive_doc(tmp_path: Path, rows: dict[str, dict[int, list[dict[str, Any]]]], threshold: float) -> dict[str, Any]:
    """An ``adaptive.json`` written by the harness's own monitor and writer from ``rows``."""
    from harness.gate.adaptive import AdaptiveMonitor, write_adaptive

    mon = AdaptiveMonitor(planned={c: sorted(r) for c, r in rows.items()}, thresholds={c: threshold for c in rows}, n_boot=200)
    records = []
    for cand, per_shard in rows.items():
        for shard, ctx in per_shard.items():
            d = mon.observe(cand, shard, {"contexts": ctx})
            records.append({"candidate": cand, "shard": shard, **d.record()})
    write_adaptive(tmp_path, records)
    doc: dict[str, Any] = json.loads((tmp_path / "adaptive.json").read_text())
    return doc


def test_adaptive_json_written_by_the_harness_passes_and_its_means_are_the_reports(tmp_path: Path) -> None:
    from harness.gate.adaptive import check_adaptive

    rows = {"a": _rows(25, 3, 1), "b": _rows(25, 3, 2)}
    doc = _adaptive_doc(tmp_path, rows, threshold=0.02)
    check_adaptive(doc, tmp_path / "adaptive.json", rows)
    assert any(r["ci"] is not None for r in doc["looks"])  # 50 clusters from look 2: bounds are computed
    for r in doc["looks"]:  # the means against an independent float64 sum over the shards so far
        seen = [s for s in range(3) if s <= r["shard"]]
        ctx = [x for s in seen for x in rows[r["candidate"]][s]]
        assert r["mean_kld"] == pytest.approx(math.fsum(x["sum_kld"] for x in ctx) / (31 * len(ctx)), rel=1e-12)


def _edit(doc: dict[str, Any], case: str) -> None:
    look = doc["looks"][1]  # candidate a, look 2: bounds present
    if case == "version":
        doc["schema"] = "fidelity.adaptive/2"
    elif case == "missing":
        del look["mean_kld"]
    elif case == "extra":
        doc["looks"][0]["verdict"] = "pass"
    elif case == "type":
        look["clusters"] = "50"
    elif case == "nan":
        look["mean_kld"] = float("nan")
    elif case == "mean":
        look["mean_kld"] = 0.0
    elif case == "side":
        look["side"] = "below" if look["side"] != "below" else "above"
    elif case == "alpha":
        doc["alpha_side"] = 0.25
    elif case == "shard":
        look["shard"] = 7
    elif case == "candidate":
        for r in doc["looks"]:
            if r["candidate"] == "b":
                r["candidate"] = "c"
    elif case == "level":
        look["level"] = 0.5


@pytest.mark.parametrize("case, pattern", [
    ("version", r"adaptive\.json: schema: expected \"fidelity\.adaptive/1\", found a string 'fidelity\.adaptive/2'"),
    ("missing", r"adaptive\.json: looks\[1\]\.mean_kld: expected present, found missing"),
    ("extra", r"adaptive\.json: looks\[0\]\.verdict: expected no such key \(known: candidate, .*\), found present"),
    ("type", r"adaptive\.json: looks\[1\]\.clusters: expected an integer, found a string '50'"),
    ("nan", r"adaptive\.json: number: expected finite JSON numbers, found NaN"),
    ("mean", r"adaptive\.json: looks\[1\]\.mean_kld: expected 0\.0\d+ \(shards \[0, 1\] of a's reports\), found 0\.0"),
    ("side", r"adaptive\.json: looks\[1\]\.side: expected .* \(its bounds \[.*\] and threshold 0\.02\), found \"(below|above)\""),
    ("alpha", r"adaptive\.json: alpha_side: expected 0\.025, found a number 0\.25"),
    ("shard", r"adaptive\.json: looks\[1\]\.shard: expected a shard a has a report for, once \(\[0, 1, 2\]\), found 7"),
    ("candidate", r"adaptive\.json: looks\[3\]\.candidate: expected a candidate with shard reports \(a, b\), found c"),
    ("level", r"adaptive\.json: looks\[1\]\.level: expected 1 - 2 alpha_k = 0\.9\d+ .*, found 0\.5"),
])
def test_adaptive_json_that_lies_is_refused(tmp_path: Path, case: str, pattern: str) -> None:
    """Publish reads a run's ``adaptive.json`` back into results.json: a wrong version, a missing or unknown
    key, a wrong type, a NaN, or a look whose numbers do not follow from the shard reports is refused by name."""
    from harness.gate.adaptive import check_adaptive
    from harness.io.jsonio import read_json

    rows = {"a": _rows(25, 3, 1), "b": _rows(25, 3, 2)}
    doc = _adaptive_doc(tmp_path, rows, threshold=0.02)
    _edit(doc, case)
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(doc))  # json.dumps writes NaN as the bare word: the strict reader refuses it
    with pytest.raises(VerificationError, match=pattern):
        check_adaptive(read_json(path), path, rows)


@pytest.mark.slow  # one run of the tiny project (shared fixture), then publish
def test_publish_and_verify_refuse_a_lying_adaptive_json(fidelity_run: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Through the commands: ``publish`` refuses a report folder whose adaptive.json lies (exit 1, named, no
    output folder), publishes one the harness wrote, and ``verify`` refuses a published set whose
    results.json ``adaptive`` block was edited and resealed."""
    from harness.cli.main import main
    from harness.io.jsonio import read_json

    root = tmp_path / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    reps = root / "reports"
    rows = {c: {int(f.stem[6:]): read_json(f)["metrics"]["contexts"] for f in sorted((reps / c).glob("shard-*.json"))}
            for c in ("good", "bad")}
    doc = _adaptive_doc(tmp_path, rows, threshold=0.01)
    doc["looks"][2]["mean_kld"] *= 0.5
    (reps / "adaptive.json").write_text(json.dumps(doc))
    args = ["publish", "--reports", str(reps), "--config", str(root / "fidelity.toml")]
    assert main([*args, "--out", str(tmp_path / "pub1")]) == 1
    err = capsys.readouterr().err
    assert f"{reps / 'adaptive.json'}: looks[2].mean_kld: expected " in err and "found" in err
    assert not (tmp_path / "pub1").exists()
    doc = _adaptive_doc(tmp_path, rows, threshold=0.01)
    (reps / "adaptive.json").write_text(json.dumps(doc))
    assert main([*args, "--out", str(tmp_path / "pub2")]) == 0
    assert main(["verify", str(tmp_path / "pub2")]) == 0
    res = json.loads((tmp_path / "pub2" / "results.json").read_text())
    assert res["adaptive"] == doc
    res["adaptive"]["looks"][0]["clusters"] += 1
    assert ("results.json: adaptive: looks[0].clusters: expected 2 (shards [0] of bad's reports), found 3"
            in _resealed_verify_output(tmp_path / "pub2", res, capsys))




# ----------------------------------------------------------------------------- tails.json re-derived by publish


def _edit_tails(doc: dict[str, Any], case: str) -> None:
    c = doc["candidates"][0]
    if case == "shard_p99":
        c["shards"][1]["percentiles"]["p99"] *= 0.5
    elif case == "ccdf":
        c["ccdf"]["y"][-1] *= 0.1
    elif case == "cum_exceedance":
        c["cumulative"]["exceedance"][next(iter(c["cumulative"]["exceedance"]))] += 1
    elif case == "cum_p99":
        c["cumulative"]["percentiles"]["p99"] = c["cumulative"]["quantile_bounds"]["p99"][1] * 2
    elif case == "extra":
        c["verdict"] = "pass"
    elif case == "problems":
        c["problems"] = []
        c["max_p99_baseline"] = 1e-12


@pytest.mark.slow  # one run of the tiny project (shared fixture), then publish
@pytest.mark.parametrize("case, pattern", [
    ("shard_p99", r"tails\.json: candidates\[0\]\.shards\[1\]\.percentiles\.p99: expected [\d.e-]+ \(shard 1's report\), found"),
    ("ccdf", r"tails\.json: candidates\[0\]\.ccdf: expected what the shard reports' summed histograms give, found other values"),
    ("cum_exceedance", r"tails\.json: candidates\[0\]\.cumulative\.exceedance: expected \{.*\} \(the shards' sums\), found"),
    ("cum_p99", r"tails\.json: candidates\[0\]\.cumulative\.percentiles\.p99: expected within \[.*\] \(the summed histograms\), found"),
    ("extra", r"tails\.json: candidates\[0\]\.verdict: expected no such key \(known: schema, candidate, .*\), found present"),
    ("problems", r"tails\.json: candidates\[0\]\.problems: expected \['bad: p99 >= .* > max 1e-12 \(max_p99 of its baseline\)'\], found \[\]"),
])
def test_publish_refuses_tails_that_do_not_follow_from_the_shard_reports(fidelity_run: Path, tmp_path: Path, case: str,
                                                                       pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``publish`` puts a run's tail reports into results.json and draws tails.png from them: every figure a shard
    report also holds must be its, the cumulative ones must add up and the CCDF and brackets must be what the
    summed histograms give -- else refused by name and nothing published. A run's own tails.json publishes."""
    from harness.cli.main import main
    from harness.reports.report_set import _read_tails, load_reports

    root = tmp_path / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    reps = root / "reports"
    groups = load_reports([reps])
    assert "bad" in _read_tails(reps / "tails.json", groups)  # the run's own file passes (by candidate)
    doc = json.loads((reps / "tails.json").read_text())
    assert doc["candidates"][0]["candidate"] == "bad"
    _edit_tails(doc, case)
    (reps / "tails.json").write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=pattern):
        _read_tails(reps / "tails.json", groups)
    assert main(["publish", "--reports", str(reps), "--config", str(root / "fidelity.toml"), "--out", str(tmp_path / "pub")]) == 1
    assert "tails.json: candidates[0]" in capsys.readouterr().err
    assert not (tmp_path / "pub").exists()


@pytest.mark.slow  # one run of the tiny project (shared fixture), then publish and verify
def test_verify_refuses_resealed_results_with_edited_tails(fidelity_run: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli.main import main

    root = tmp_path / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    pub = tmp_path / "pub"
    assert main(["publish", "--reports", str(root / "reports"), "--config", str(root / "fidelity.toml"), "--out", str(pub)]) == 0
    res = json.loads((pub / "results.json").read_text())
    res["candidates"]["good"]["tails"]["cumulative"]["max"] *= 0.5
    assert "results.json: candidates.good.tails.cumulative: expected " in _resealed_verify_output(pub, res, capsys)


# ----------------------------------------------------------------------------- paired reports re-derived by publish


@pytest.fixture(scope="module")
def paired_run(tmp_path_factory: pytest.TempPathFactory, fidelity_run: Path) -> Path:
    """The tiny project's run plus its declared pair (good vs bad) over the run's shards, computed as the pair
    case computes it (the session's positions from the cached captures, :meth:`PairCase.run`) and written into
    the run's report folder by the plugin's writer."""
    from harness.inputs.config import load_config
    from harness.plugin.kind_paired import PairCase
    from harness.reports.paired import write_paired
    from harness.run.session import FidelitySession

    root = tmp_path_factory.mktemp("paired") / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    config = load_config(root / "fidelity.toml")
    pair = config.pairs[0]
    case = PairCase.run(FidelitySession(config=config), pair.a, pair.b, pair.margin, [0, 1, 2, 3])
    write_paired(root / "reports", case.payload)
    return root


def _edit_pair(doc: dict[str, Any], case: str) -> None:
    if case == "verdict":  # a verdict the interval and the margin do not give, whatever the genuine one is
        forged = "inconclusive" if doc["verdict"] == "equivalent" else "equivalent"
        doc["verdict"], doc["verdict_named"] = forged, forged
    elif case == "mean":
        doc["kld_mean"]["a"] *= 0.5
    elif case == "ci":
        doc["kld_mean"]["ci95"] = [-1e-6, 1e-6] if doc["kld_mean"]["ci95"] is not None else [0.0, 1.0]
    elif case == "margin":  # a wider margin that makes the pair "equivalent", every other field made consistent with it
        doc["margin"] = 10.0
        doc["verdict"], doc["verdict_named"] = "equivalent", "equivalent"
    elif case == "seed":
        doc["bootstrap"]["seed"] += 1
    elif case == "wins":
        doc["contexts"]["a_wins"] += 1
    elif case == "shards":
        doc["shards"] = [0, 9]


@pytest.mark.slow  # runs the pair of the tiny project once (module fixture) after the shared run
@pytest.mark.parametrize("case, pattern", [
    ("verdict", r"good-vs-bad\.json: verdict: expected '.*' \(from the interval and the margin\), found (equivalent|inconclusive)"),
    ("mean", r"good-vs-bad\.json: kld_mean\.a: expected [\d.e-]+ \(the shard reports of shards \[0, 1, 2, 3\]\), found"),
    ("ci", r"good-vs-bad\.json: (kld_mean\.ci95: expected .* \(re-derived from the shard reports\)|verdict: expected)"),
    ("margin", r"good-vs-bad\.json: margin: expected 0\.001 \(the pair's margin in the configuration\), found 10\.0"),
    ("seed", r"good-vs-bad\.json: bootstrap: expected seed 20240601, n_boot \d+ \(the configuration's\), found seed 20240602"),
    ("wins", r"good-vs-bad\.json: contexts: expected \{.*\} \(the shard reports' per-context means\), found"),
    ("shards", r"good-vs-bad\.json: shards: expected shards both good and bad have reports for \(\[0, 1, 2, 3\]\), found \[9\]"),
])
def test_publish_refuses_a_paired_report_that_does_not_follow_from_the_shard_reports(
        paired_run: Path, tmp_path: Path, case: str, pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A pair's headline (means, difference, its interval by the same cluster bootstrap, verdict under the
    configured margin, context wins) is re-derived from the two candidates' shard reports: a forged one is
    refused by name and nothing is published; the run's own passes."""
    from harness.cli.main import main
    from harness.inputs.config import load_config
    from harness.reports.report_set import _read_paired, load_reports

    root = tmp_path / "p"
    shutil.copytree(paired_run, root, symlinks=True)
    path = root / "reports" / "paired" / "good-vs-bad.json"
    groups, config = load_reports([root / "reports"]), load_config(root / "fidelity.toml")
    assert _read_paired(path, groups, config)["shards"] == [0, 1, 2, 3]  # the run's own passes
    doc = json.loads(path.read_text())
    _edit_pair(doc, case)
    path.write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=pattern):
        _read_paired(path, groups, config)
    assert main(["publish", "--reports", str(root / "reports"), "--config", str(root / "fidelity.toml"), "--out", str(tmp_path / "pub")]) == 1
    assert "good-vs-bad.json: " in capsys.readouterr().err and not (tmp_path / "pub").exists()


@pytest.mark.slow  # the pair's run (module fixture), publish and verify
def test_verify_refuses_resealed_results_with_an_edited_pair(paired_run: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli.main import main

    pub = tmp_path / "pub"
    assert main(["publish", "--reports", str(paired_run / "reports"), "--config", str(paired_run / "fidelity.toml"),
                 "--out", str(pub)]) == 0
    assert main(["verify", str(pub)]) == 0
    res = json.loads((pub / "results.json").read_text())
    assert [p["shards"] for p in res["paired"]] == [[0, 1, 2, 3]]
    res["paired"][0]["kld_mean"]["b"] *= 2
    assert "results.json: paired[0]: kld_mean.b: expected " in _resealed_verify_output(pub, res, capsys)


# ----------------------------------------------------------------------------- window.json re-derived by publish


@pytest.fixture(scope="module")
def window_run(tmp_path_factory: pytest.TempPathFactory, fidelity_run: Path) -> Path:
    """The tiny project's run plus its window comparison (windows 0 and 16 over the run's shards), computed as the
    window cases compute it (:meth:`WindowCase.run` on the session's positions) and written by the plugin's writer."""
    from harness.inputs.config import load_config
    from harness.plugin.kind_window import WindowCase
    from harness.reports.windows import write_window
    from harness.run.session import FidelitySession

    root = tmp_path_factory.mktemp("window") / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    session = FidelitySession(config=load_config(root / "fidelity.toml"))
    write_window(root / "reports", [WindowCase.run(session, k, [0, 1, 2, 3]).payload for k in (0, 16)])
    return root


def _self_consistent(doc: dict[str, Any], edit: Any) -> dict[str, Any]:
    """``doc`` with its summaries edited by ``edit`` and every derived figure recomputed from them (a careful forgery)."""
    from harness.metrics.bootstrap import draw_cluster_weights, ratio_interval
    from harness.reports.windows import compare_windows

    by_window: dict[int, dict[str, Any]] = {}
    for key, w in doc["windows"].items():
        by_window[int(key)] = {c: {k: s[k] for k in ("score_from", "n_positions", "n_contexts", "mean_kld", "ci95", "clusters")}
                               for c, s in w["candidates"].items()}
    edit(by_window)
    for w in by_window.values():
        for s in w.values():
            cl = s["clusters"]
            sums, counts = np.asarray(cl["sum_kld"]), np.asarray(cl["positions"])
            s["mean_kld"] = float(sums.sum() / counts.sum())
            s["ci95"] = ratio_interval(draw_cluster_weights(len(counts), cl["n_boot"], cl["seed"]), sums, counts, bounds=(0.0, float("inf")))
    out = compare_windows(doc["base_window"], by_window)
    return {**out, "notes": doc["notes"], "shards": doc["shards"]}


@pytest.mark.slow  # the shared run, then the window comparison in-process
@pytest.mark.parametrize("case, pattern", [
    ("verdict", r"window\.json: verdict: expected 'ranking stable across windows' \(from the summaries\), found ranking CHANGES"),
    ("mean", r"window\.json: windows\.16\.candidates\.good\.mean_kld: expected [\d.e-]+ \(from its clusters\), found 0\.0"),
    ("seed", r"window\.json: windows\.0\.candidates\.bad\.clusters: expected seed 20240601, n_boot \d+, found seed 1, n_boot"),
    ("base", r"window\.json: windows\.0\.candidates\.good\.clusters: expected the shard reports' \(shards \[0, 1, 2, 3\]\), "
             r"found other clusters, positions or KLD sums"),
    ("later", r"window\.json: windows\.16\.candidates\.bad\.clusters: expected the base window's clusters less 16 positions a "
              r"context, and no more KLD, found other positions or more KLD"),
])
def test_publish_refuses_a_window_json_that_does_not_follow(window_run: Path, tmp_path: Path, case: str, pattern: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``window.json`` is checked against itself (every summary from its cluster sums, the verdict, rankings, flips
    and power recomputed) and its base window against the shard reports; a later window is bounded by the base
    (fewer positions, no more KLD). A careful forgery that recomputes every derived figure is still refused."""
    from harness.cli.main import main
    from harness.inputs.config import load_config
    from harness.reports.report_set import _read_window, load_reports

    root = tmp_path / "p"
    shutil.copytree(window_run, root, symlinks=True)
    path = root / "reports" / "window.json"
    groups, config = load_reports([root / "reports"]), load_config(root / "fidelity.toml")
    doc = _read_window(path, groups, config)  # the run's own passes
    assert doc["shards"] == [0, 1, 2, 3] and doc["verdict"] == "ranking stable across windows"
    if case == "verdict":
        doc["verdict"] = "ranking CHANGES with the window"
    elif case == "mean":
        doc["windows"]["16"]["candidates"]["good"]["mean_kld"] = 0.0
    elif case == "seed":
        doc["windows"]["0"]["candidates"]["bad"]["clusters"]["seed"] = 1
    elif case == "base":  # good's base-window KLD halved, everything derived recomputed to match
        doc = _self_consistent(doc, lambda bw: bw[0]["good"]["clusters"].update(
            sum_kld=[x * 0.5 for x in bw[0]["good"]["clusters"]["sum_kld"]]))
    elif case == "later":  # bad's KLD from row 16 on raised above its whole-context KLD, everything recomputed
        doc = _self_consistent(doc, lambda bw: bw[16]["bad"]["clusters"].update(
            sum_kld=[x * 10.0 for x in bw[0]["bad"]["clusters"]["sum_kld"]]))
    path.write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=pattern):
        _read_window(path, groups, config)
    assert main(["publish", "--reports", str(root / "reports"), "--config", str(root / "fidelity.toml"), "--out", str(tmp_path / "pub")]) == 1
    assert "window.json: " in capsys.readouterr().err and not (tmp_path / "pub").exists()


@pytest.mark.slow  # the window run (module fixture), publish and verify
def test_verify_refuses_resealed_results_with_an_edited_window(window_run: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli.main import main

    pub = tmp_path / "pub"
    assert main(["publish", "--reports", str(window_run / "reports"), "--config", str(window_run / "fidelity.toml"),
                 "--out", str(pub)]) == 0
    assert main(["verify", str(pub)]) == 0
    res = json.loads((pub / "results.json").read_text())
    res["window"]["windows"]["16"]["candidates"]["good"]["rel_change_mean_kld"] = 0.0
    assert "results.json: window: windows.16.candidates.good.rel_change_mean_kld: expected " in _resealed_verify_output(pub, res, capsys)
