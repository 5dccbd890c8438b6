"""Provenance records read back: a provenance sidecar or suite provenance records that lie are refused,
naming the file, the key, the expected and the found value.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.errors import VerificationError

# ----------------------------------------------------------------------------- provenance records


@pytest.mark.parametrize("text, pattern", [
    ('{"schema": "fidelity.corpus-provenance/2"}', r"provenance\.json: schema: expected \"fidelity\.corpus-provenance/1\", "
                                                  r"found a string 'fidelity\.corpus-provenance/2'"),
    ('{"default": {"licence": "MIT"}}', r"provenance\.json: schema: expected present, found missing"),
    ('{"schema": "fidelity.corpus-provenance/1", "default": {"licence": "MIT", "licenses": "x"}}',
     r"provenance\.json: default\.licenses: expected no such key \(known: source, licence\), found present"),
    ('{"schema": "fidelity.corpus-provenance/1", "documents": {"a.txt": {"source": 3}}}',
     r"provenance\.json: documents\.a\.txt\.source: expected null or a string, found an integer 3"),
    ('{"schema": "fidelity.corpus-provenance/1", "documents": {"a.txt": {"source": NaN}}}',
     r"provenance\.json: number: expected finite JSON numbers, found NaN"),
    ('{"schema": "fidelity.corpus-provenance/1", "default": {}, "default": {"licence": "MIT"}}',
     r"provenance\.json: JSON key 'default': expected each key once, found listed twice"),
    ('{"schema": "fidelity.corpus-provenance/1", "documents": []}',
     r"provenance\.json: documents: expected an object of an object \{source, licence\} \(no other key\), found an array \[\]"),
])
def test_provenance_sidecar_that_lies_is_refused(tmp_path: Path, text: str, pattern: str) -> None:
    """The corpus sidecar is read strictly and against its closed schema: wrong version, missing version, an
    unknown key (a misspelt ``licenses`` would otherwise attribute nothing), a wrong type, a NaN, a key twice."""
    from harness.inputs.provenance import document_records

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text\n")
    (corpus / "provenance.json").write_text(text)
    with pytest.raises(VerificationError, match=pattern):
        document_records(corpus, ["a.txt"])


def _reseal_documents(tmp_path: Path, tiny_suite: Path, edit: Any) -> Path:
    from harness.inputs.suite import manifest_sha256

    d = tmp_path / "s"
    shutil.copytree(tiny_suite, d)
    doc = json.loads((d / "suite.json").read_text())
    edit(doc["documents"][min(doc["documents"])], doc)
    try:
        doc["manifest_sha256"] = manifest_sha256(doc)
    except ValueError:  # a NaN has no canonical JSON: left unsealed (the reader refuses it first)
        pass
    (d / "suite.json").write_text(json.dumps(doc))
    return d


@pytest.mark.parametrize("case, pattern", [
    ("missing", r"suite\.json: documents\..*\.licence: expected present, found missing"),
    ("extra", r"suite\.json: documents\..*\.url: expected no such key \(known: sha256, bytes, source, licence\), found present"),
    ("type", r"suite\.json: documents\..*\.sha256: expected a string, found an integer 7"),
    ("nan", r"suite\.json: number: expected finite JSON numbers, found NaN"),
    ("sha", r"suite\.json: documents\..*\.sha256: expected 64 lower-case hex digits, found 'abc'"),
    ("negative", r"suite\.json: documents\..*\.bytes: expected a size >= 0, found -1"),
    ("parent", r"suite\.json: documents\['\.\./x\.txt'\]: expected a relative path inside the corpus, found \.\./x\.txt"),
    ("block", r"suite\.json: documents: expected an object of an object \{sha256, bytes, source, licence\} \(no other key\), found null"),
])
def test_suite_provenance_records_that_lie_are_refused(tmp_path: Path, tiny_suite: Path, case: str, pattern: str) -> None:
    """A resealed ``suite.json`` (its manifest hash re-computed) whose per-document records lie is refused when
    the suite loads, before any document is opened or any card renders them."""
    from harness.inputs.suite import Suite

    def edit(rec: dict[str, Any], doc: dict[str, Any]) -> None:
        if case == "missing":
            del rec["licence"]
        elif case == "extra":
            rec["url"] = "http://x"
        elif case == "type":
            rec["sha256"] = 7
        elif case == "nan":
            rec["bytes"] = float("nan")
        elif case == "sha":
            rec["sha256"] = "abc"
        elif case == "negative":
            rec["bytes"] = -1
        elif case == "parent":
            doc["documents"]["../x.txt"] = dict(rec)
        elif case == "block":
            doc["documents"] = None

    d = _reseal_documents(tmp_path, tiny_suite, edit)
    with pytest.raises(VerificationError, match=pattern):
        Suite.load(d)
