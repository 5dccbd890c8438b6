"""Tamper campaign, published and foreign reports: every number read is checked for its meaning
(harness/io/domain.py) and the headline is re-derived from the report's own rows.

A valid ``qwen38-fidelity-report/2`` over the fixture suite's shard 0 is built with the harness's own
blocks (tail binning, window, bootstrap); ``fidelity aggregate`` accepts it and reproduces its rows'
weighted mean (float64 numpy). Each case then plants ONE hostile value, keeping every total the old
reader checked consistent, and asserts: exit 1, one line naming the file, the field, the expected and
the found value, no traceback, and no ``--out`` folder.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "fixtures" / "suite"


@pytest.fixture(scope="module")
def report_doc() -> dict[str, Any]:
    """A valid published report over shard 0 of the fixture suite (random but plausible per-context rows)."""
    from harness.inputs.suite import Suite
    from harness.interchange.bootstrap_method import percentile_bootstrap
    from harness.interchange.report_format import bin_edges, tail_block, window_block
    from harness.interchange.suite_manifest import shard_view_digest

    suite = Suite.load(SUITE)
    rng = np.random.default_rng(7)
    idx = list(suite.shard_indices(0))
    n = suite.n_ctx - 1
    rows: list[dict[str, Any]] = []
    values: list[float] = []
    for i in idx:
        v = rng.gamma(2.0, 0.01, size=n)
        values.extend(v.tolist())
        top1 = int(rng.integers(n // 2, n + 1))
        rows.append({"index": i, "source_cluster": suite.contexts[i].source_cluster, "stratum": suite.contexts[i].stratum,
                     "positions_scored": n, "mean_kld": float(np.mean(v)), "top1_agreement": top1 / n})
    edges = bin_edges()
    counts = [0] * (len(edges) + 1)
    for x in values:
        counts[bisect.bisect_right(edges, x)] += 1
    means = [float(r["mean_kld"]) for r in rows]
    pos = n * len(rows)
    return {
        "schema": "qwen38-fidelity-report/2", "reference": "fidelity:bf16", "candidate": "fidelity:int8",
        "reference_identity": None, "candidate_identity": None, "head_sha256": "0" * 64, "candidate_head_sha256": None,
        "suite_token_sha256": shard_view_digest(suite, 0), "filter": "all",
        "scored_position_window": window_block(0, suite.n_ctx, len(rows)),
        "contexts": len(rows), "scored_positions": pos,
        "token_mean_kld": float(np.sum(np.array(means) * n) / pos), "max_kld": float(max(values)),
        "kld_tail": tail_block(counts, pos, float(max(values)), float(min(values)), {}),
        "context_macro_mean_kld": float(np.mean(means)),
        "context_bootstrap": percentile_bootstrap(means, [r["source_cluster"] for r in rows]),
        "top1_agreement": float(np.mean([r["top1_agreement"] for r in rows])), "per_context_all": rows,
    }


def _run(tmp_path: Path, doc: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "report-int8.json"
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    rc = main(["aggregate", str(path), "--suite", str(SUITE), "--out", str(tmp_path / "out")])
    got = capsys.readouterr()
    return rc, got.out + got.err


def test_valid_report_aggregates_to_its_rows(report_doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _ = _run(tmp_path, report_doc, capsys)
    assert rc == 0
    agg = json.loads((tmp_path / "out" / "published-aggregate.json").read_text())
    rows = report_doc["per_context_all"]
    w = np.array([r["positions_scored"] for r in rows], dtype=np.float64)
    assert agg["token_mean_kld"] == pytest.approx(float(np.dot(w, [r["mean_kld"] for r in rows]) / w.sum()), rel=1e-12)
    assert agg["context_bootstrap"]["ci95_low"] >= 0


def _negative_context(d: dict[str, Any]) -> None:
    """One context's mean KLD made negative, another raised so every total stays what it was."""
    r0, r1 = d["per_context_all"][0], d["per_context_all"][1]
    shift = r0["mean_kld"] + 0.05
    r0["mean_kld"] -= shift
    r1["mean_kld"] += shift


def _negative_positions(d: dict[str, Any]) -> None:
    """A negative ``positions_scored`` with the positions' sum kept (a weighted mean with a negative weight)."""
    r0, r1 = d["per_context_all"][0], d["per_context_all"][1]
    r1["positions_scored"] += r0["positions_scored"] + 10
    r0["positions_scored"] = -10


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d[key] = value
    return edit


def _row(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d["per_context_all"][3][field] = value
    return edit


def _tail_count(d: dict[str, Any]) -> None:
    counts = d["kld_tail"]["counts"]
    k = max(range(len(counts)), key=lambda j: counts[j])
    counts[k] += 5
    counts[0] -= 5  # the sum is kept; the underflow bin goes below zero


CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("negative context KLD, totals kept", _negative_context,
     r"per_context_all\[0\]\.mean_kld: expected >= 0 \(a divergence; rounding tolerance 1e-09\), found -0\.0[45]"),
    ("negative positions_scored, sum kept", _negative_positions,
     r"per_context_all\[0\]\.positions_scored: expected an integer >= 1, found -10"),
    ("1e308 context KLD", _row("mean_kld", 1e308), r"per_context_all\[3\]\.mean_kld: expected a number within \+-1e\+15, found 1e\+308"),
    ("float positions", _row("positions_scored", 255.0), r"per_context_all\[3\]\.positions_scored: expected an integer, found 255\.0"),
    ("top-1 above one", _row("top1_agreement", 1.25), r"per_context_all\[3\]\.top1_agreement: expected a fraction within \[0, 1\], found 1\.25"),
    ("headline mean divided by ten", lambda d: d.update(token_mean_kld=d["token_mean_kld"] / 10),
     r"token_mean_kld \(re-derived from its rows\): expected [0-9.e-]+, found [0-9.e-]+"),
    ("macro mean divided by ten", lambda d: d.update(context_macro_mean_kld=d["context_macro_mean_kld"] / 10),
     r"context_macro_mean_kld \(re-derived from its rows\): expected"),
    ("negative p99", _set("p99_kld", -0.5), r"p99_kld: expected >= 0 .*found -0\.5"),
    ("infinite max written as a huge number", _set("max_kld", 1e300), r"max_kld: expected a number within"),
    ("negative interval end", lambda d: d["context_bootstrap"].update(ci95_low=-0.001), r"context_bootstrap\.ci95_low: expected >= 0"),
    ("negative tail bin, sum kept", _tail_count, r"kld_tail\.counts\[0\]: expected an integer >= 0, found -"),
    ("string count", _set("contexts", "16"), r"contexts: expected an integer, found '16'"),
]


@pytest.mark.parametrize(("edit", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_report_value_out_of_domain_refused(report_doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            edit: Callable[[dict[str, Any]], None], pattern: str) -> None:
    doc = copy.deepcopy(report_doc)
    edit(doc)
    rc, out = _run(tmp_path, doc, capsys)
    assert rc == 1, out
    assert "report-int8.json: " in out and "Traceback" not in out and "OverflowError" not in out
    assert len([ln for ln in out.splitlines() if ln.startswith("fidelity: error:")]) == 1
    assert re.search(pattern, out), out
    assert not (tmp_path / "out").exists()


def test_paired_refuses_a_negative_context_of_either_side(report_doc: dict[str, Any], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "report-a.json", tmp_path / "report-b.json"
    a.write_text(json.dumps(report_doc))
    doc = copy.deepcopy(report_doc)
    _negative_context(doc)
    b.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["paired", str(a), str(a), "--name-a", "x", "--name-b", "y", "--out", str(tmp_path / "ok")]) == 0
    assert main(["paired", str(a), str(b), "--name-a", "x", "--name-b", "y", "--out", str(tmp_path / "p")]) == 1
    err = capsys.readouterr().err
    assert "report-b.json: per_context_all[0].mean_kld: expected >= 0" in err and "Traceback" not in err
    assert not (tmp_path / "p").exists()
