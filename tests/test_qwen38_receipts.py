"""The published Qwen3.8-27B suite's own files (fixtures/qwen38-receipts, real bytes) read, checked and re-derived.

The figures are compared with the numbers the published tool printed into the receipts (its own output, read
here straight from the JSON), never with this harness's own output; every refusal class is a real receipt or
manifest with one lie in it (resealed where the lie must get past the digest).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.cli.main import main
from harness.errors import VerificationError
from harness.interchange.ladder_receipts import read_cumulative, read_paired
from harness.interchange.manifest_read import check_model_identity, read_manifest
from harness.interchange.receipt_figures import candidate_figures, own_interval

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "qwen38-receipts"
FIVE = ("k4", "k5k6", "hyd", "ctx", "fp8")


@pytest.fixture(scope="module")
def rdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The receipts decompressed, each checked against the published sha256 recorded beside them."""
    out = tmp_path_factory.mktemp("qwen38")
    sums = dict(reversed(line.split()) for line in (FIX / "SHA256SUMS").read_text().splitlines())
    for name, digest in sums.items():
        data = lzma.decompress((FIX / f"{name}.xz").read_bytes())
        assert hashlib.sha256(data).hexdigest() == digest, name
        (out / name).write_bytes(data)
    return out


def _load(p: Path) -> Any:
    return json.loads(p.read_text())


def _write(p: Path, doc: Any) -> Path:
    p.write_text(json.dumps(doc, indent=2))
    return p


def _reseal(doc: dict[str, Any]) -> dict[str, Any]:
    """Recompute the digest as the published aggregator does (so only the semantic check can catch the lie)."""
    ex = set(doc.get("content_sha256_excludes") or ["generated_utc"]) | {"content_sha256", "content_sha256_excludes"}
    body = {k: v for k, v in doc.items() if k not in ex}
    doc["content_sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return doc


# ------------------------------------------------------------------ the manifests
def test_v5_manifest_accepted_and_its_fields_read(rdir: Path) -> None:
    raw = _load(rdir / "kld5-suite-manifest.json")
    m = read_manifest(rdir / "kld5-suite-manifest.json")
    assert m.schema == "qwen38-distribution-fidelity/6" and len(m.rows) == 5120 and m.context_length == 2048
    assert m.suite_token_sha256 == raw["suite_token_sha256"].lower() and m.suite_token_sha256.startswith("510541f6")
    rows = raw["context_index"]
    assert len(m.selected("analysis")) == sum(r["partition"] == "analysis" for r in rows) == 4064
    assert len(m.selected("qualification")) == 1056 and len(m.selected("sentinel")) == 32
    assert len({r.source_cluster for r in m.rows}) == 842
    # the receipts name this file by its sha256: the lineage the aggregate checks
    assert m.sha256 == _load(rdir / "kld5-10M-k4.json")["suite"]["parent"]["manifest_sha256"]
    check_model_identity(m, "ref", tokenizer_sha256=raw["model_identity"]["tokenizer_sha256"])
    with pytest.raises(VerificationError, match=r"ref: tokenizer_sha256 .*expected 0997f410.*found 00000000"):
        check_model_identity(m, "ref", tokenizer_sha256="0" * 64)


def test_v4_manifest_accepted(rdir: Path) -> None:
    m = read_manifest(rdir / "v4-suite-manifest.json")
    assert (m.schema, len(m.rows), len(m.selected("sentinel"))) == ("qwen38-distribution-fidelity/3", 160, 16)


def _leak(doc: dict[str, Any]) -> None:
    """One qualification context moved to analysis, the declared counts kept consistent: its cluster is now on both sides."""
    clusters = Counter(r["source_cluster"] for r in doc["context_index"] if r["partition"] == "qualification")
    row = next(r for r in doc["context_index"] if r["partition"] == "qualification" and clusters[r["source_cluster"]] > 1)
    row["partition"] = "analysis"
    doc["partitions"]["analysis"] += 1
    doc["partitions"]["qualification"] -= 1


MANIFEST_LIES = {
    "token digest": (lambda d: d["context_index"][7].update(token_sha256="f" * 64), r"suite_token_sha256 .*expected [0-9a-f]{64}, found 510541f6"),
    "partition leak": (_leak, r"a source cluster on one side only.*partition leak"),
    "context count": (lambda d: d.update(contexts=5119), r"contexts \(the rows of context_index\): expected 5120, found 5119"),
    "version": (lambda d: d.update(schema="qwen38-distribution-fidelity/7"),
                r"schema .*expected qwen38-distribution-fidelity/1 or .* or qwen38-distribution-fidelity/6, found 'qwen38-distribution-fidelity/7'"),
    "cluster list": (lambda d: d["cluster_partition"]["qualification"].append(d["cluster_partition"]["analysis"][0]),
                     r"cluster_partition.qualification .*listed but not in qualification: \['arxiv5-cs-AI-0000'\]"),
    "sentinel count": (lambda d: d["partitions"].update(sentinels=33), r"partitions.sentinels \(the rows' count\): expected 32, found 33"),
    "strata": (lambda d: d["context_index"][0].update(stratum="code"), r"strata \(the rows' stratum counts\)"),
    "scored positions": (lambda d: d.update(total_scored_positions=10480641), r"total_scored_positions .*expected 10480640, found 10480641"),
}


@pytest.mark.parametrize("lie", sorted(MANIFEST_LIES))
def test_manifest_lie_refused(rdir: Path, tmp_path: Path, lie: str) -> None:
    doc = _load(rdir / "kld5-suite-manifest.json")
    change, pattern = MANIFEST_LIES[lie]
    change(doc)
    with pytest.raises(VerificationError, match=pattern):
        read_manifest(_write(tmp_path / "suite-manifest.json", doc))


# ------------------------------------------------------------------ cumulative receipts
def test_headline_rederived_exactly(rdir: Path) -> None:
    """k5k6's printed token mean, top-1, clusters and percentile interval, re-derived from its rows to the bit."""
    m = read_manifest(rdir / "kld5-suite-manifest.json")
    rc = read_cumulative(rdir / "kld5-10M-k5k6.json", m)
    printed = _load(rdir / "kld5-10M-k5k6.json")
    f = candidate_figures(rc, n_boot=2_000)
    assert f["token_mean_kld"] == printed["token_mean_kld"] == pytest.approx(0.0032098839572023935, rel=0, abs=0)
    assert f["top1_agreement"] == printed["top1_agreement"] and f["source_clusters"] == printed["source_clusters"] == 842
    assert f["published_ci95"] == [printed["context_bootstrap"]["ci95_low"], printed["context_bootstrap"]["ci95_high"]]
    # independent float64 check of the token mean (numpy, not fsum)
    rows = printed["per_context_all"]
    pos = np.array([r["positions_scored"] for r in rows], dtype=np.float64)
    assert np.dot(np.array([r["mean_kld"] for r in rows]), pos) / pos.sum() == pytest.approx(f["token_mean_kld"], rel=1e-12)
    lo, hi = f["own_ci95"]
    assert lo < f["token_mean_kld"] < hi and hi - lo > 0


def test_own_interval_is_a_cluster_interval(rdir: Path) -> None:
    """The studentized interval reacts to clusters: the same rows under one cluster per context are narrower."""
    rc = read_cumulative(rdir / "kld5-1M-tail-ctx.json")
    base = own_interval(rc.rows, n_boot=2_000)
    from dataclasses import replace

    split = own_interval([replace(r, source_cluster=str(r.index)) for r in rc.rows], n_boot=2_000)
    assert base is not None and split is not None and (split[1] - split[0]) < (base[1] - base[0])


def _row0(d: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = d["per_context_all"][0]
    return row


RECEIPT_LIES = {
    "schema": (lambda d: d.update(schema="qwen38-kld-ladder-cumulative/9"), False,
               r"schema \(a cumulative ladder receipt\): expected qwen38-kld-ladder-cumulative/2 or qwen38-kld-ladder-cumulative/3, found "
               r"'qwen38-kld-ladder-cumulative/9'"),
    "content digest": (lambda d: d.update(token_mean_kld=d["token_mean_kld"] * 0.5), False,
                       r"content_sha256 \(sha256 of the receipt less generated_unix, content_sha256.*changed after it was sealed"),
    "negative KLD": (lambda d: _row0(d).update(mean_kld=-0.001), True, r"per_context_all\[0\].mean_kld: expected >= 0"),
    "zero positions": (lambda d: _row0(d).update(positions_scored=0), True, r"per_context_all\[0\].positions_scored: expected an integer >= 1"),
    "top-1 beyond positions": (lambda d: _row0(d).update(top1_agreement=1.5), True, r"top1_agreement: expected a fraction within \[0, 1\]"),
    "top-1 not a count": (lambda d: _row0(d).update(top1_agreement=0.5 + 1e-4), True, r"a count of top-1 hits\): expected an integer"),
    "negative maximum": (lambda d: d.update(max_kld=-1.0), True, r"max_kld: expected >= 0"),
    "not a number": (lambda d: d.update(token_mean_kld="0.01"), True, r"token_mean_kld: expected a number, found '0.01'"),
    "scored positions": (lambda d: d.update(scored_positions=d["scored_positions"] + 1), True,
                         r"scored_positions \(the rows' positions_scored summed\): expected 2096128, found 2096129"),
    "token mean": (lambda d: d.update(token_mean_kld=d["token_mean_kld"] * 1.001), True, r"token_mean_kld \(re-derived from its rows\)"),
    "clusters": (lambda d: d.update(source_clusters=d["source_clusters"] + 1), True, r"source_clusters \(distinct clusters of the rows\)"),
    "tail": (lambda d: d["tail"]["counts"].__setitem__(5, d["tail"]["counts"][5] + 1), True, r"tail.total_count \(its counts summed\)"),
    "duplicate context": (lambda d: d["per_context_all"].__setitem__(1, dict(d["per_context_all"][0])), True, r"context 0: expected in one row only"),
}


@pytest.mark.parametrize("lie", sorted(RECEIPT_LIES))
def test_receipt_lie_refused(rdir: Path, tmp_path: Path, lie: str) -> None:
    doc = _load(rdir / "kld5-2M-tail-k4.json")
    change, reseal, pattern = RECEIPT_LIES[lie]
    change(doc)
    with pytest.raises(VerificationError, match=pattern):
        read_cumulative(_write(tmp_path / "r.json", _reseal(doc) if reseal else doc))


def _swap_clusters(d: dict[str, Any]) -> None:
    """Two contexts of one stratum trade clusters: every count and total of the receipt still agrees."""
    rows = d["per_context_all"]
    a = rows[0]
    b = next(r for r in rows if r["stratum"] == a["stratum"] and r["source_cluster"] != a["source_cluster"])
    a["source_cluster"], b["source_cluster"] = b["source_cluster"], a["source_cluster"]


MANIFEST_CHECKS = {
    "index beyond the suite": (lambda d: _row0(d).update(index=6000), r"context 6000 \(a context of .*\): expected 0..5119, found 6000"),
    "cluster": (lambda d: _swap_clusters(d), r"source_cluster, stratum of context \d+ \(the manifest's\)"),
    "positions per context": (lambda d: [r.update(positions_scored=2046) for r in d["per_context_all"]],
                              r"positions_scored \(the suite's positions per context less the window\): expected 2047, found 2046"),
    "suite digest": (lambda d: d["suite"]["parent"].update(suite_token_sha256="0" * 64), r"a receipt of another suite"),
    "manifest digest": (lambda d: d["suite"]["parent"].update(manifest_sha256="0" * 64), r"suite.parent.manifest_sha256 \(sha256 of"),
    "reference model": (lambda d: d["reference_identity"].update(config_sha256="0" * 64),
                        r"reference_identity: config_sha256 \(the suite manifest's model_identity.*expected 191e0af2.*the suite was tokenized for another model"),
    "shard lineage": (lambda d: d["shards"][1].update(suite_token_sha256=d["shards"][0]["suite_token_sha256"]),
                      r"shards\[1\].suite_token_sha256 \(lineage of contexts 512..1023"),
}


@pytest.mark.parametrize("lie", sorted(MANIFEST_CHECKS))
def test_receipt_against_manifest_refused(rdir: Path, tmp_path: Path, lie: str) -> None:
    m = read_manifest(rdir / "kld5-suite-manifest.json")
    doc = _load(rdir / "kld5-2M-tail-k4.json")
    change, pattern = MANIFEST_CHECKS[lie]
    change(doc)
    path = _write(tmp_path / "r.json", _reseal(doc))
    with pytest.raises(VerificationError, match=pattern):
        read_cumulative(path, m)


def test_another_suite_refused_by_the_cli(rdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["aggregate", str(rdir / "kld5-2M-tail-k4.json"), "--suite", str(rdir / "v4-suite-manifest.json"),
                 "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "a receipt of another suite" in err and "Traceback" not in err and not (tmp_path / "out").exists()


# ------------------------------------------------------------------ paired receipts
def test_paired_rederived_exactly_through_the_cli(rdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The published NVFP4 comparisons at shard 0: every printed difference, interval, win count and cluster count."""
    assert main(["paired", str(rdir / "kld5-1M-paired-nvfp4.json"), "--suite", str(rdir / "kld5-suite-manifest.json"),
                 "--margin", "0.001", "--out", str(tmp_path)]) == 0
    out = _load(tmp_path / "paired-receipt.json")["comparisons"]
    printed = _load(rdir / "kld5-1M-paired-nvfp4.json")["comparisons"]
    assert [r["key"] for r in out] == list(printed)
    for r in out:
        p = printed[r["key"]]
        assert (r["difference_a_minus_b"], r["ci95_low"], r["ci95_high"], r["a_wins"], r["b_wins"], r["clusters"]) == (
            p["difference_a_minus_b"], p["ci95_low"], p["ci95_high"], p["a_wins"], p["b_wins"], p["clusters"])
        # independent: the mean of per-context differences from the two input files, and this harness's verdict's side
        a = {x["index"]: x["mean_kld"] for x in _load(rdir / f"kld5-1M-{'nvfp4' if r['a'] == 'nvfp4' else 'tail-' + r['a']}.json")["per_context_all"]}
        b = {x["index"]: x["mean_kld"] for x in _load(rdir / f"kld5-1M-tail-{r['b']}.json")["per_context_all"]}
        assert statistics.fmean(a[i] - b[i] for i in sorted(a)) == r["difference_a_minus_b"]
        lo, hi = r["own_ci95"]
        assert lo <= r["token_mean_difference"] <= hi
        want = ("equivalent" if -1e-3 <= lo and hi <= 1e-3 else f"{r['a']} better" if hi < 0 else f"{r['b']} better" if lo > 0
                else "inconclusive")
        assert r["verdict"] == want
    text = capsys.readouterr().out
    assert "| nvfp4 - ctx | 512 |" in text and "this harness 95%" in text


PAIRED_LIES = {
    "content digest": (lambda d, _r: d["comparisons"]["nvfp4_vs_ctx"].update(a_wins=1), False, r"content_sha256 .*changed after it was sealed"),
    "printed difference": (lambda d, _r: d["comparisons"]["nvfp4_vs_ctx"].update(
        difference_a_minus_b=d["comparisons"]["nvfp4_vs_ctx"]["difference_a_minus_b"] * 1.01), True,
        r"comparisons.nvfp4_vs_ctx.difference_a_minus_b \(re-derived from the rows by the published method\)"),
    "win count": (lambda d, _r: d["comparisons"]["nvfp4_vs_fp8"].update(b_wins=d["comparisons"]["nvfp4_vs_fp8"]["b_wins"] - 1), True,
                  r"comparisons.nvfp4_vs_fp8.b_wins \(re-derived"),
    "wins beyond contexts": (lambda d, _r: d["comparisons"]["nvfp4_vs_fp8"].update(b_wins=600), True,
                             r"a_wins \+ b_wins \+ ties: expected at most its contexts \(512\)"),
    "input file": (lambda _d, r: _write(r / "kld5-1M-tail-ctx.json", _reseal({**_load(r / "kld5-1M-tail-ctx.json"), "label": "edited"})),
                   True, r"inputs.ctx.sha256 \(sha256 of .*another file than the one this comparison was made from"),
}


@pytest.mark.parametrize("lie", sorted(PAIRED_LIES))
def test_paired_lie_refused(rdir: Path, tmp_path: Path, lie: str, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("kld5-1M-nvfp4.json", "kld5-1M-tail-ctx.json", "kld5-1M-tail-fp8.json"):
        (tmp_path / name).write_bytes((rdir / name).read_bytes())
    doc = _load(rdir / "kld5-1M-paired-nvfp4.json")
    change, reseal, pattern = PAIRED_LIES[lie]
    change(doc, tmp_path)
    path = _write(tmp_path / "paired.json", _reseal(doc) if reseal else doc)
    assert main(["paired", str(path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
    assert __import__("re").search(pattern, err), err


def test_unknown_paired_version_refused(rdir: Path, tmp_path: Path) -> None:
    doc = _reseal({**_load(rdir / "kld5-10M-paired.json"), "schema": "qwen38-kld-ladder-paired/3"})
    with pytest.raises(VerificationError, match=r"expected qwen38-kld-ladder-paired/1 or qwen38-kld-ladder-paired/2, found 'qwen38-kld-ladder-paired/3'"):
        read_paired(_write(tmp_path / "p.json", doc))


# ------------------------------------------------------------------ the aggregate command
def test_aggregate_partition_and_files(rdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run restricted to the analysis partition says so, re-derives over exactly those contexts, writes the ladder."""
    m = _load(rdir / "kld5-suite-manifest.json")
    analysis = {r["index"] for r in m["context_index"] if r["partition"] == "analysis"}
    assert main(["aggregate", str(rdir / "kld5-2M-tail-k4.json"), "--suite", str(rdir / "kld5-suite-manifest.json"),
                 "--partition", "analysis", "--size", "k4=28313841196", "--out", str(tmp_path)]) == 0
    doc = _load(tmp_path / "receipts.json")
    rows = [r for r in _load(rdir / "kld5-2M-tail-k4.json")["per_context_all"] if r["index"] in analysis]
    (f,) = doc["candidates"]
    assert doc["selection"] == "analysis" and f["contexts"] == len(rows) and not f["matches_printed"]
    assert f["token_mean_kld"] == pytest.approx(math.fsum(r["mean_kld"] * r["positions_scored"] for r in rows)
                                                / sum(r["positions_scored"] for r in rows), rel=1e-14)
    assert "selection analysis" in capsys.readouterr().out
    assert (tmp_path / "ladder.md").read_text().count("| k4 ") == 1 and (tmp_path / "kld-vs-size.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_five_headlines_and_paired_table(rdir: Path, tmp_path: Path) -> None:
    """The v5 ladder: all five candidates and the five published comparisons, re-derived to the bit."""
    assert main(["aggregate", *(str(rdir / f"kld5-10M-{n}.json") for n in FIVE), "--suite", str(rdir / "kld5-suite-manifest.json"),
                 "--method", "published", "--out", str(tmp_path)]) == 0
    for f in _load(tmp_path / "receipts.json")["candidates"]:
        p = _load(rdir / f"kld5-10M-{f['candidate']}.json")
        assert (f["token_mean_kld"], f["top1_agreement"], f["published_ci95"]) == (
            p["token_mean_kld"], p["top1_agreement"], [p["context_bootstrap"]["ci95_low"], p["context_bootstrap"]["ci95_high"]])
    assert main(["paired", str(rdir / "kld5-10M-paired.json"), "--margin", "0.0001", "--out", str(tmp_path)]) == 0
    printed = _load(rdir / "kld5-10M-paired.json")["comparisons"]
    for r in _load(tmp_path / "paired-receipt.json")["comparisons"]:
        assert (r["ci95_low"], r["ci95_high"], r["a_wins"]) == tuple(printed[r["key"]][k] for k in ("ci95_low", "ci95_high", "a_wins"))


# ------------------------------------------------------------------ a /6 suite with its token files, read in place
def _suite6(root: Path) -> dict[str, Any]:
    """A small suite in the v5 manifest's shape: 8 contexts of 6 tokens, 4 clusters, both partitions, one sentinel."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(8):
        ids = [int(x) for x in rng.integers(0, 500, size=6)]
        (root / "tokens").mkdir(parents=True, exist_ok=True)
        (root / "tokens" / f"context-{i:04d}.json").write_text(json.dumps(ids))
        rows.append({"index": i, "stratum": ("code", "literary")[i % 2], "source_cluster": f"doc{i // 2}", "source_window_index": 0,
                     "source_char_start": 0, "source_char_end": 10, "file": f"tokens/context-{i:04d}.json", "tokens": 6,
                     "token_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(), "calibration_shingle_hits": 0,
                     "partition": "qualification" if i >= 6 else "analysis", "sentinel": i == 0})
    return {"schema": "qwen38-distribution-fidelity/6", "model_identity": {"tokenizer_sha256": "ab" * 32, "config_sha256": "cd" * 32},
            "context_length": 6, "scored_positions_per_context": 5, "contexts_requested": 8, "allow_shortfall": False, "contexts": 8,
            "total_scored_positions": 40, "partitions": {"analysis": 6, "qualification": 2, "sentinels": 1},
            "strata": {"code": 4, "literary": 4}, "source_clusters": 4,
            "cluster_partition": {"analysis": ["doc0", "doc1", "doc2"], "qualification": ["doc3"], "overlap": []},
            "context_index": rows,
            "suite_token_sha256": hashlib.sha256("".join(r["token_sha256"] for r in rows).encode()).hexdigest()}


def test_v6_suite_with_token_files_read_in_place(tmp_path: Path) -> None:
    from harness.interchange.suite_manifest import load_published_suite

    doc = _suite6(tmp_path)
    _write(tmp_path / "suite-manifest.json", doc)
    suite = load_published_suite(tmp_path).suite
    assert suite.n_contexts == 8 and suite.tokenizer_sha256 == "ab" * 32
    assert [int(t) for t in suite.tokens[3]] == json.loads((tmp_path / "tokens" / "context-0003.json").read_text())
    doc["context_index"][5]["partition"] = "qualification"  # doc2 now on both sides; declared counts kept in step
    doc["partitions"].update(analysis=5, qualification=3)
    _write(tmp_path / "suite-manifest.json", doc)
    with pytest.raises(VerificationError, match=r"a source cluster on one side only.*found 1 cluster\(s\) in both, e.g. \['doc2'\]"):
        load_published_suite(tmp_path)


def test_one_ladder_is_one_measurement(rdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Receipts of another reference (resealed, consistent in itself) are not put into one ladder with the rest."""
    doc = _load(rdir / "kld5-1M-tail-fp8.json")
    doc["reference_identity"]["index_sha256"] = "0" * 64
    other = _write(tmp_path / "fp8.json", _reseal(doc))
    read_cumulative(other)
    assert main(["aggregate", str(rdir / "kld5-1M-tail-ctx.json"), str(other), "--suite", str(rdir / "kld5-suite-manifest.json"),
                 "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "reference_identity.index_sha256" in err and "two measurements" in err and not (tmp_path / "out").exists()
