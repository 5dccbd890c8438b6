"""A ``.kld`` published in parts: a parts manifest that lies is refused, naming the file, the key, the
expected and the found value.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.errors import VerificationError

# ----------------------------------------------------------------------------- a .kld published in parts


@pytest.fixture()
def kld_parts(tmp_path: Path) -> Path:
    from harness.llamacpp.kld_file import write_kld
    from harness.llamacpp.kld_parts import split_file

    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 32, size=(3, 8))
    whole = write_kld(tmp_path / "ref.kld", tokens, 32, [rng.normal(size=(7, 32)).astype(np.float32) for _ in range(3)])
    (tmp_path / "parts").mkdir()
    manifest = split_file(whole, tmp_path / "parts", 300)
    whole.unlink()
    return manifest


@pytest.mark.parametrize("case, pattern", [
    ("version", r"ref\.kld\.parts\.json: schema: expected \"fidelity\.kld-parts/1\", found a string 'fidelity\.kld-parts/2'"),
    ("part_sha_type", r"ref\.kld\.parts\.json: parts\[1\]\.sha256: expected a string, found an integer 7"),
    ("part_sha_missing", r"ref\.kld\.parts\.json: parts\[1\]\.sha256: expected present, found missing"),
    ("sha_missing", r"ref\.kld\.parts\.json: sha256: expected present, found missing"),
    ("sha_form", r"ref\.kld\.parts\.json: sha256: expected 64 lower-case hex digits, found 'ABC'"),
    ("extra", r"ref\.kld\.parts\.json: parts\[0\]\.offset: expected no such key \(known: name, bytes, sha256\), found present"),
    ("file_type", r"ref\.kld\.parts\.json: file: expected a string, found null"),
    ("twice", r"ref\.kld\.parts\.json: parts\[1\]\.name: expected each part once, found ref\.kld\.part-000 listed again"),
    ("nan", r"ref\.kld\.parts\.json: number: expected finite JSON numbers, found NaN"),
    ("symlink", r"ref\.kld\.part-001: part of ref\.kld: expected a file in .*parts, found a symbolic link to .*elsewhere"),
])
def test_kld_parts_manifest_that_lies_is_refused(kld_parts: Path, tmp_path: Path, case: str, pattern: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A parts manifest is read by its closed schema: a wrong version, a digest of the wrong type or missing
    (every part and the whole file are hashed by whoever splits them), an unknown key, a part listed twice, a
    NaN, or a part that is a symbolic link out of the folder is refused by name; ``kld import`` leaves nothing."""
    from harness.cli.main import main
    from harness.llamacpp.kld_parts import open_parts

    doc = json.loads(kld_parts.read_text())
    if case == "version":
        doc["schema"] = "fidelity.kld-parts/2"
    elif case == "part_sha_type":
        doc["parts"][1]["sha256"] = 7
    elif case == "part_sha_missing":
        del doc["parts"][1]["sha256"]
    elif case == "sha_missing":
        del doc["sha256"]
    elif case == "sha_form":
        doc["sha256"] = "ABC"
    elif case == "extra":
        doc["parts"][0]["offset"] = 0
    elif case == "file_type":
        doc["file"] = None
    elif case == "twice":
        doc["parts"][1] = dict(doc["parts"][0])
        doc["bytes"] = sum(p["bytes"] for p in doc["parts"])
    elif case == "nan":
        doc["bytes"] = float("nan")
    elif case == "symlink":
        part = kld_parts.parent / doc["parts"][1]["name"]
        (tmp_path / "elsewhere").mkdir()
        part.rename(tmp_path / "elsewhere" / part.name)
        part.symlink_to(tmp_path / "elsewhere" / part.name)
    kld_parts.write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=pattern):
        open_parts(kld_parts)
    capsys.readouterr()
    assert main(["kld", "import", str(kld_parts), "--out", str(tmp_path / "imp")]) == 1
    assert not (tmp_path / "imp").exists()
