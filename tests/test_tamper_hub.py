"""Tamper campaign, models from the Hub (``hf://org/repo@revision``): provenance cannot lie.

The offline cache is built in huggingface_hub's real on-disk layout: ``blobs/`` named by sha256 for Git-LFS
files (``*.safetensors``) and by the Git blob hash for every other file, ``refs/main`` holding the commit and
``snapshots/<commit>/`` of relative links to the blobs. huggingface_hub's own ``scan_cache_dir`` and
``snapshot_download`` (offline_cache) read it back before any case runs. Each case then replaces ONE thing and
checks the refusal names the file, the digest the blob promises and the one found, with nothing written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.engines.hub import git_blob_sha1, parse_hub_spec
from harness.engines.identity import model_identity
from harness.errors import FidelityError
from harness.inputs.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "5e1f0c2d" + "7" * 32
LFS = (".safetensors",)


def real_hub_cache(cache: Path, repo_id: str, model: Path, commit: str = COMMIT) -> Path:
    """``model``'s files laid out as huggingface_hub downloads them (module docstring); the snapshot folder."""
    from huggingface_hub.utils.sha import git_hash

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in sorted(p for p in model.iterdir() if p.is_file()):
        data = f.read_bytes()
        blob = hashlib.sha256(data).hexdigest() if f.name.endswith(LFS) else git_hash(data)
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snap / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snap





def test_real_layout_resolves_and_the_identity_records_each_blob(project_with_model: Callable[[Path, str], Path], offline_cache: Path, fidelity_project: Path, tmp_path: Path) -> None:
    from huggingface_hub import scan_cache_dir, snapshot_download

    snap = real_hub_cache(offline_cache, "acme/tiny-good", fidelity_project / "models" / "good")
    info = scan_cache_dir(offline_cache)  # huggingface_hub reads the layout as its own
    (repo,) = info.repos
    assert repo.repo_id == "acme/tiny-good" and {r.commit_hash for r in repo.revisions} == {COMMIT}
    assert Path(snapshot_download("acme/tiny-good", revision="main")) == snap
    assert load_config(project_with_model(tmp_path / "p", "hf://acme/tiny-good@main")).candidate("good").model == snap
    ident = model_identity(snap)
    blobs = ident["hub"]["blobs"]
    assert blobs["model.safetensors"] == ident["weights"]["model.safetensors"]  # LFS: named by its sha256
    cfg = (snap / "config.json").read_bytes()
    assert blobs["config.json"] == hashlib.sha1(b"blob %d\0" % len(cfg) + cfg).hexdigest() == git_blob_sha1(snap / "config.json")


def _replace_blob(snap: Path, name: str, other: Path) -> None:
    """Overwrite the blob ``name`` links to with another model's file (the link and the blob's name unchanged)."""
    blob = Path(os.path.realpath(snap / name))
    blob.chmod(0o644)
    blob.write_bytes(other.read_bytes())


def _plain_copy(snap: Path, name: str, other: Path) -> None:
    """Replace the link by a plain file of another model."""
    (snap / name).unlink()
    shutil.copyfile(other, snap / name)


def _relink_outside(snap: Path, name: str, other: Path) -> None:
    (snap / name).unlink()
    os.symlink(other.resolve(), snap / name)


@pytest.mark.parametrize(("edit", "name", "pattern"), [
    (_replace_blob, "model.safetensors",
     r"model\.safetensors: content of a Hub cache snapshot file: expected the sha256 \(an LFS file\) its blob is named by, "
     r"[0-9a-f]{64}, found [0-9a-f]{64} \(the file was replaced"),
    (_replace_blob, "config.json",
     r"config\.json: content of a Hub cache snapshot file: expected the Git blob hash its blob is named by, [0-9a-f]{40}, found [0-9a-f]{40}"),
    (_plain_copy, "model.safetensors", r"model\.safetensors: Hub cache snapshot file: expected a link to a blob in .*blobs, found a plain file"),
    (_relink_outside, "model.safetensors", r"model\.safetensors: Hub cache snapshot file: expected a link to a blob in .*blobs, found a link to "),
], ids=["weights-blob-replaced", "config-blob-replaced", "plain-file", "link-outside-blobs"])
def test_replaced_snapshot_file_refused_before_loading(project_with_model: Callable[[Path, str], Path], offline_cache: Path, fidelity_project: Path, tmp_path: Path, edit: object,
                                                       name: str, pattern: str) -> None:
    snap = real_hub_cache(offline_cache, "acme/tiny-good", fidelity_project / "models" / "good")
    other = fidelity_project / "models" / "bad" / name
    if not other.is_file() or other.read_bytes() == (snap / name).read_bytes():
        other = ROOT / "fixtures" / "candidates" / "int8" / name
    if other.read_bytes() == (snap / name).read_bytes():  # another model of one architecture: its config, edited
        other = tmp_path / name
        other.write_bytes((snap / name).read_bytes().replace(b"{", b'{"torch_dtype_note": "replaced", ', 1))
    assert callable(edit)
    edit(snap, name, other)
    toml = project_with_model(tmp_path / "p", "hf://acme/tiny-good@main")
    with pytest.raises(ConfigError, match=r"candidates\[0\]\.model: .*" + pattern):
        load_config(toml)
    with pytest.raises(FidelityError, match=pattern):
        model_identity(snap)  # and the identity never records the replaced bytes as the repository's


@pytest.mark.parametrize(("spec", "pattern"), [
    ("hf://acme/tiny-good@../../../../etc", r"its revision '\.\./\.\./\.\./\.\./etc' is neither a commit hash nor a Git ref name"),
    ("hf://acme/..", r"its repository id 'acme/\.\.' is not org/name"),
    ("hf://../tiny-good", r"its repository id '\.\./tiny-good' is not org/name"),
    ("hf://acme/tiny-good@refs/heads/x.lock", r"its revision 'refs/heads/x\.lock' is neither"),
    ("hf://acme/tiny-good@a b", r"its revision 'a b' is neither"),
    ("hf://acme/tiny-good@.hidden", r"its revision '\.hidden' is neither"),
])
def test_repository_ids_and_revisions_validated_before_huggingface_hub(spec: str, pattern: str) -> None:
    with pytest.raises(FidelityError, match=pattern):
        parse_hub_spec(spec)


def test_valid_revisions_pass() -> None:
    for rev in ("main", "v1.0", "refs/pr/1", COMMIT, "feature/x-y_z"):
        assert parse_hub_spec(f"hf://acme/m@{rev}").revision == rev


def test_pytest_run_with_a_dotdot_repository_is_one_named_error(project_with_model: Callable[[Path, str], Path], fidelity_project: Path, tmp_path: Path) -> None:
    """``hf://org/..`` ended in an INTERNALERROR: now the configuration is refused in one line, nothing written."""
    project_with_model(tmp_path / "p", "hf://acme/..")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "-q", "-p", "no:cacheprovider", "-m", "fidelity"],
                         cwd=tmp_path / "p", env=env, capture_output=True, text=True, check=False, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "INTERNALERROR" not in text and "Traceback" not in text, text[-3000:]
    assert "its repository id 'acme/..' is not org/name" in text, text[-3000:]
    assert not (tmp_path / "p" / "fidelity-reports").exists()
