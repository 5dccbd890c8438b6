"""A ``.kld`` published in parts: read in order without joining them (byte counts and digests checked
against the manifest), equal to the whole file row for row; every broken part refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from harness.cli.main import main
from harness.errors import VerificationError
from harness.llamacpp.kld_file import read_kld, write_kld
from harness.llamacpp.kld_parts import split_file


@pytest.fixture()
def parted(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(3)
    n_ctx, v, n_chunk = 16, 64, 5
    tokens = rng.integers(0, v, size=(n_chunk, n_ctx))
    chunks = [rng.normal(size=(n_ctx - 1, v)).astype(np.float32) * 4 for _ in range(n_chunk)]
    whole = write_kld(tmp_path / "ref.kld", tokens, v, chunks)
    (tmp_path / "parts").mkdir()
    manifest = split_file(whole, tmp_path / "parts", 777)  # parts cut across the header, tokens and rows
    return whole, manifest


def test_parts_read_in_order_equal_the_whole(parted: tuple[Path, Path]) -> None:
    whole, manifest = parted
    names = sorted(p.name for p in manifest.parent.iterdir())
    assert len(names) > 3 and not any(n.endswith(".kld") for n in names)  # never joined on disk
    a, b = read_kld(whole), read_kld(manifest)
    assert (a.n_ctx, a.n_vocab, a.n_chunk) == (b.n_ctx, b.n_vocab, b.n_chunk)
    assert np.array_equal(a.tokens, b.tokens)
    for c in range(a.n_chunk):
        assert np.array_equal(np.asarray(a.rows[c]), b.rows[c])
        assert np.array_equal(a.log_probs(c), b.log_probs(c))
    assert sorted(p.name for p in manifest.parent.iterdir()) == names


def test_import_from_parts_records_the_whole_files_digest(parted: tuple[Path, Path], tmp_path: Path) -> None:
    whole, manifest = parted
    assert main(["kld", "import", str(manifest), "--out", str(tmp_path / "imp")]) == 0
    model = json.loads((tmp_path / "imp" / "reference" / "capture.json").read_text())["model"]
    assert model["sha256"] == hashlib.sha256(whole.read_bytes()).hexdigest()


@pytest.mark.parametrize("what", ["truncated part", "missing part", "flipped byte", "total"])
def test_broken_parts_refused(parted: tuple[Path, Path], tmp_path: Path, what: str, capsys: pytest.CaptureFixture[str]) -> None:
    _whole, manifest = parted
    doc = json.loads(manifest.read_text())
    part = manifest.parent / doc["parts"][2]["name"]
    if what == "truncated part":
        part.write_bytes(part.read_bytes()[:-1])
        expected = "byte count (the manifest's): expected 777, found 776"
    elif what == "missing part":
        part.unlink()
        expected = "part-002: part of ref.kld: expected present, found missing"
    elif what == "flipped byte":
        data = bytearray(part.read_bytes())
        data[100] ^= 1
        part.write_bytes(bytes(data))
        expected = "part-002: sha256 (the parts manifest's)"
    else:
        doc["bytes"] += 1
        manifest.write_text(json.dumps(doc))
        expected = "bytes (the sum of the parts)"
    capsys.readouterr()
    assert main(["kld", "import", str(manifest), "--out", str(tmp_path / "imp")]) == 1
    assert expected in capsys.readouterr().err
    if what != "flipped byte":  # a flipped byte is found by the digest (import), not by the structure
        with pytest.raises(VerificationError):
            read_kld(manifest)
