"""Suite provenance: per-document sha256/source/licence in suite.json, and re-deriving the contexts
from the texts (`fidelity suite verify --corpus`)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.cli.main import main
from harness.errors import VerificationError
from harness.inputs.provenance import rederive_contexts
from harness.inputs.suite import Suite, build_suite, list_documents, manifest_sha256

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures"


def test_fixture_suite_records_every_document() -> None:
    """The embedded suite names the 47 held-out documents with their sha256 (recomputed here with
    hashlib), the Debian source page and the PSF licence."""
    suite = Suite.load(FIX / "suite")
    records = suite.meta["documents"]
    heldout = [ln for ln in (FIX / "corpus" / "heldout.txt").read_text().splitlines() if ln.strip()]
    assert sorted(records) == sorted(heldout) and len(records) == 47
    for rel, r in records.items():
        data = (FIX / "corpus" / rel).read_bytes()
        assert r["sha256"] == hashlib.sha256(data).hexdigest() and r["bytes"] == len(data)
        assert r["licence"] == "PSF-2.0"
        assert r["source"].endswith("/usr/share/doc/python3.11/html/_sources/" + rel.replace(".txt", ".rst.txt"))
    assert {c.document for c in suite.contexts} <= set(records)


def test_sidecar_is_not_a_document() -> None:
    assert "provenance.json" not in list_documents(FIX / "corpus")


def test_fixture_contexts_rederive_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["suite", "verify", str(FIX / "suite"), "--corpus", str(FIX / "corpus"),
                 "--tokenizer", str(FIX / "model" / "tokenizer.json")])
    out = capsys.readouterr().out
    assert code == 0
    assert "47 documents match their sha256" in out and "PSF-2.0 x47" in out
    assert "96/96 match the authoritative token ids" in out


def test_flags_attribute_and_sidecar_overrides(tmp_path: Path, tiny_corpus: Path, tiny_tokenizer: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus)
    (corpus / "provenance.json").write_text(json.dumps({
        "schema": "fidelity.corpus-provenance/1",
        "documents": {"prose/doc0.txt": {"source": "https://example.org/doc0", "licence": "CC0-1.0"}}}))
    s = build_suite(corpus, tiny_tokenizer, 32, 6, 3, 0, tmp_path / "s", source="generated", licence="MIT")
    recs = s.meta["documents"]
    assert recs["prose/doc0.txt"]["licence"] == "CC0-1.0" and recs["prose/doc0.txt"]["source"] == "https://example.org/doc0"
    assert recs["prose/doc1.txt"]["licence"] == "MIT" and recs["prose/doc1.txt"]["source"] == "generated"
    assert "provenance.json" not in recs
    # same token ids as a build without provenance
    plain = build_suite(tiny_corpus, tiny_tokenizer, 32, 6, 3, 0, tmp_path / "plain")
    assert np.array_equal(plain.tokens, s.tokens) and plain.suite_token_sha256 == s.suite_token_sha256
    assert recs["prose/doc1.txt"]["sha256"] == plain.meta["documents"]["prose/doc1.txt"]["sha256"]
    assert plain.meta["documents"]["prose/doc1.txt"]["licence"] is None


def test_sidecar_naming_a_missing_document_is_refused(tmp_path: Path, tiny_corpus: Path, tiny_tokenizer: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus)
    (corpus / "provenance.json").write_text(json.dumps({
        "schema": "fidelity.corpus-provenance/1", "documents": {"prose/nope.txt": {"licence": "MIT"}}}))
    with pytest.raises(VerificationError, match=r"provenance.json: documents: expected paths of documents under .*found \['prose/nope.txt'\]"):
        build_suite(corpus, tiny_tokenizer, 32, 6, 3, 0, tmp_path / "s")


def test_changed_document_is_refused(tmp_path: Path, tiny_suite: Path, tiny_corpus: Path, tiny_tokenizer: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus)
    doc = Suite.load(tiny_suite).contexts[0].document
    (corpus / doc).write_text((corpus / doc).read_text() + " ")
    with pytest.raises(VerificationError, match=rf"{doc}: document sha256 \(suite.json documents\): expected"):
        rederive_contexts(Suite.load(tiny_suite), corpus, tiny_tokenizer)


def test_non_round_trip_is_reported_not_refused(tmp_path: Path, tiny_suite: Path, tiny_corpus: Path,
                                                tiny_tokenizer: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Tokens that a re-tokenization does not reproduce (simulated: one id changed, every hash resealed)
    are listed with the first differing position; the command still succeeds."""
    from harness.io.hashing import tokens_sha256

    d = tmp_path / "s"
    shutil.copytree(tiny_suite, d)
    arr = np.load(d / "tokens.npy")
    arr[4, 7] = (int(arr[4, 7]) + 1) % 300
    np.save(d / "tokens.npy", arr)
    doc = json.loads((d / "suite.json").read_text())
    doc["suite_token_sha256"] = tokens_sha256(arr)
    for sh in doc["shards"]:
        sh["sha256"] = tokens_sha256(arr[sh["start"]:sh["stop"]])
    doc["manifest_sha256"] = manifest_sha256(doc)
    (d / "suite.json").write_text(json.dumps(doc))
    check = rederive_contexts(Suite.load(d), tiny_corpus, tiny_tokenizer)
    assert check.differing == [(4, 7)] and check.matching == [0, 1, 2, 3, 5]
    assert main(["suite", "verify", str(d), "--corpus", str(tiny_corpus), "--tokenizer", str(tiny_tokenizer)]) == 0
    out = capsys.readouterr().out
    assert "5/6 match" in out and "contexts that do not match: 4 (from token 7)" in out and "does not round-trip" in out


def test_wrong_tokenizer_is_refused(tmp_path: Path, tiny_suite: Path, tiny_corpus: Path) -> None:
    with pytest.raises(VerificationError, match=r"tokenizer.json: tokenizer sha256 \(suite.json tokenizer.sha256\)"):
        rederive_contexts(Suite.load(tiny_suite), tiny_corpus, FIX / "model" / "tokenizer.json")


def test_hand_edited_record_is_refused(tmp_path: Path, tiny_suite: Path) -> None:
    d = tmp_path / "s"
    shutil.copytree(tiny_suite, d)
    doc = json.loads((d / "suite.json").read_text())
    first = min(doc["documents"])
    doc["documents"][first]["bytes"] = "12"
    doc["manifest_sha256"] = manifest_sha256(doc)
    (d / "suite.json").write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=r"suite.json: documents\..*\.bytes: expected an integer, found a string '12'"):
        Suite.load(d)
