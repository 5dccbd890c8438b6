"""Suites from corpora people have: a Hugging Face ``datasets`` source (parquet, jsonl, arrow, a save_to_disk
folder; offline), one long file split by a stated rule, and the tokenizer's chat template."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.cli.main import main
from harness.inputs.corpus_sources import split_text
from harness.inputs.suite import Suite


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No network for datasets or huggingface_hub (as HF_DATASETS_OFFLINE=1 / HF_HUB_OFFLINE=1), a private cache."""
    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed")
    from huggingface_hub import constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "ds-cache")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def rows(tiny_corpus: Path) -> dict[str, list[str]]:
    """The nine documents of the tiny corpus as rows: an id column and a text column."""
    docs = sorted(p for p in tiny_corpus.rglob("*") if p.is_file() and p.suffix in (".txt", ".md", ".rst")
                  and not p.name.startswith("."))
    return {"doc_id": [f"doc/{p.stem}" for p in docs], "body": [p.read_text("utf-8") for p in docs]}


def _build(tmp: Path, tok: Path, *source: str, name: str = "suite", extra: tuple[str, ...] = ()) -> Suite:
    assert main(["suite", "build", *source, "--corpus-out", str(tmp / f"{name}-corpus"), "--tokenizer", str(tok),
                 "--n-ctx", "32", "--contexts", "8", "--shards", "2", "--seed", "0", "--out", str(tmp / name), *extra]) == 0
    return Suite.load(tmp / name, verify=True)


def _contexts_match_texts(suite: Suite, corpus: Path, tok: Path) -> None:
    """Every context is the tokenizer's ids of its document at its recorded offset (tokenized here, independently)."""
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(tok))
    for c in suite.contexts:
        ids = t.encode((corpus / c.document).read_text("utf-8"), add_special_tokens=False).ids
        assert np.array_equal(suite.tokens[c.index], np.asarray(ids[c.start_token:c.start_token + suite.n_ctx]))


def test_datasets_sources_of_every_format_give_one_suite(tmp_path: Path, tiny_tokenizer: Path, rows: dict[str, list[str]],
                                                         offline: None, capsys: pytest.CaptureFixture[str]) -> None:
    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed")

    ds = datasets.Dataset.from_dict(rows)
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    ds.to_json(str(tmp_path / "rows.jsonl"), lines=True)
    ds.save_to_disk(str(tmp_path / "saved"))
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    hashes = {}
    for fmt, src in (("parquet", tmp_path / "rows.parquet"), ("json", tmp_path / "rows.jsonl"), ("arrow", arrow),
                     ("save_to_disk", tmp_path / "saved")):
        s = _build(tmp_path, tiny_tokenizer, "--from-dataset", str(src), "--text-column", "body", "--id-column", "doc_id",
                   "--source-name", "acme/tiny-docs", "--source-revision", "abc123", "--license", "CC-BY-4.0", name=fmt)
        corpus = tmp_path / f"{fmt}-corpus"
        # one document per row, named by its id, with the row's text byte for byte
        for doc_id, body in zip(rows["doc_id"], rows["body"]):
            assert (corpus / f"{doc_id.replace('/', '_')}.txt").read_text("utf-8") == body
        _contexts_match_texts(s, corpus, tiny_tokenizer)
        rec = s.meta["corpus_source"]
        assert (rec["kind"], rec["name"], rec["revision"], rec["format"]) == ("datasets", "acme/tiny-docs", "abc123", fmt)
        assert (rec["text_column"], rec["id_column"], rec["rows"], rec["licence"]) == ("body", "doc_id", 9, "CC-BY-4.0")
        assert rec["fingerprint"]
        for rel, sha in rec["files"].items():  # every data file by sha256, computed here independently
            f = src if src.is_file() else src / rel
            assert hashlib.sha256(f.read_bytes()).hexdigest() == sha
        docs = s.meta["documents"]
        assert len(docs) == 9 and {d["licence"] for d in docs.values()} == {"CC-BY-4.0"}
        assert docs["doc_readme.txt"]["source"] == "acme/tiny-docs@abc123: doc_readme"
        hashes[fmt] = s.suite_token_sha256
        assert "no licence" not in capsys.readouterr().err
    assert len(set(hashes.values())) == 1, hashes  # the same rows give the same suite in every format


def test_missing_licence_warns_and_is_recorded_as_null(tmp_path: Path, tiny_tokenizer: Path, rows: dict[str, list[str]],
                                                       offline: None, capsys: pytest.CaptureFixture[str]) -> None:
    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed")

    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "rows.parquet"))
    s = _build(tmp_path, tiny_tokenizer, "--from-dataset", str(tmp_path / "rows.parquet"), "--text-column", "body")
    err = capsys.readouterr().err
    assert "warning:" in err and "9 of 9 documents have no licence" in err and "pass --license" in err
    assert {d["licence"] for d in s.meta["documents"].values()} == {None}
    assert sorted(s.meta["documents"])[0] == "row-000000.txt"  # no id column: row numbers
    assert s.meta["corpus_source"]["licence"] is None


def test_a_wrong_column_is_named(tmp_path: Path, tiny_tokenizer: Path, rows: dict[str, list[str]], offline: None,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed")

    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "rows.parquet"))
    assert main(["suite", "build", "--from-dataset", str(tmp_path / "rows.parquet"), "--text-column", "text",
                 "--corpus-out", str(tmp_path / "c"), "--tokenizer", str(tiny_tokenizer), "--n-ctx", "32", "--contexts",
                 "8", "--shards", "2", "--seed", "0", "--out", str(tmp_path / "s")]) == 2
    assert "--text-column: expected one of the columns ['doc_id', 'body'], found 'text'" in capsys.readouterr().err


def test_a_datasets_source_without_datasets_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """datasets is an extra: without it, reading a datasets source is one line naming the install command."""
    import sys

    from harness.errors import MissingPackageError
    from harness.inputs.corpus_sources import load_rows

    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    with pytest.raises(MissingPackageError, match=r"datasets source: datasets is not installed: pip install 'fidelity-harness\[datasets\]'"):
        load_rows(tmp_path, None)


@pytest.mark.parametrize(("rule", "pieces"), [
    ("blank-lines", ["a b\nc", "d", "e"]),
    ("lines", ["a b", "c", "d", "  ", "e"]),
    ("regex:^d", ["a b\nc", "d\n  \n\ne"]),
])
def test_split_rules(rule: str, pieces: list[str]) -> None:
    text = "a b\nc\n\nd\n  \n\ne\n"
    want = [p for p in pieces if p.strip()]
    assert split_text(text, rule) == want


def test_one_long_file_split_into_documents(tmp_path: Path, tiny_tokenizer: Path, rows: dict[str, list[str]]) -> None:
    sections = [f"# {i}\n{body}" for i, body in zip(rows["doc_id"], rows["body"])]
    long_file = tmp_path / "book.md"
    long_file.write_text("\n".join(sections), "utf-8")
    s = _build(tmp_path, tiny_tokenizer, "--split-file", str(long_file), "--split-rule", "regex:^# ", "--license", "MIT")
    corpus = tmp_path / "suite-corpus"
    texts = [(corpus / f"book-{i:05d}.txt").read_text("utf-8") for i in range(len(sections))]
    assert texts == [sec.strip("\n") for sec in sections]
    _contexts_match_texts(s, corpus, tiny_tokenizer)
    rec = s.meta["corpus_source"]
    assert rec["kind"] == "file" and rec["split_rule"] == "regex:^# " and rec["documents"] == 9
    assert rec["sha256"] == hashlib.sha256(long_file.read_bytes()).hexdigest()
    assert main(["suite", "verify", str(tmp_path / "suite"), "--corpus", str(corpus), "--tokenizer", str(tiny_tokenizer)]) == 0


TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def test_chat_template_is_applied_and_recorded(tmp_path: Path, tiny_tokenizer: Path, rows: dict[str, list[str]],
                                               offline: None) -> None:
    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed")
    import jinja2

    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "tokenizer.json").write_bytes(tiny_tokenizer.read_bytes())
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE,
                                                               "tokenizer_class": "PreTrainedTokenizerFast"}))
    chats: list[Any] = [[{"role": "user", "content": q}, {"role": "assistant", "content": a}]
                        for q, a in zip(rows["body"][0::2], rows["body"][1::2])]
    datasets.Dataset.from_dict({"messages": chats}).to_json(str(tmp_path / "chats.jsonl"), lines=True)
    s = _build(tmp_path, tiny_tokenizer, "--from-dataset", str(tmp_path / "chats.jsonl"), "--text-column", "messages",
               "--chat-template", str(tok_dir), "--license", "MIT", extra=("--contexts", "6"))
    corpus = tmp_path / "suite-corpus"
    render = jinja2.Template(TEMPLATE)
    for i, chat in enumerate(chats):  # the template rendered here with jinja2 directly
        assert (corpus / f"row-{i:06d}.txt").read_text("utf-8") == render.render(messages=chat, add_generation_prompt=False)
    rec = s.meta["corpus_source"]["chat_template"]
    assert rec["template_sha256"] == hashlib.sha256(TEMPLATE.encode()).hexdigest()
    assert rec["tokenizer_config_sha256"] == hashlib.sha256((tok_dir / "tokenizer_config.json").read_bytes()).hexdigest()
    _contexts_match_texts(s, corpus, tiny_tokenizer)
