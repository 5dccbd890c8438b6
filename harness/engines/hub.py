"""Models by name: ``model = "hf://org/repo@revision"`` resolved to a local snapshot with huggingface_hub.

Reasoning: docs/engines.md §"Models by name".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import FidelityError
from harness.io.escape import hub_id_problem
from harness.io.hashing import file_hexdigest, sha256_file

PREFIX = "hf://"
_SPEC = re.compile(r"^hf://([^@]*)(?:@(.*))?$", re.DOTALL)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: Characters ``git check-ref-format`` refuses anywhere in a ref name (besides control characters).
_REF_BAD = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def ref_name_problem(rev: str) -> str | None:
    """Why ``rev`` is neither a commit hash nor a valid Git ref name (``git check-ref-format`` rules), or None."""
    if _COMMIT.match(rev):
        return None
    if not rev or len(rev) > 255:
        return "empty or longer than 255 characters"
    if ".." in rev or "@{" in rev or "//" in rev or rev == "@":
        return "'..', '@{', '//' or a lone '@'"
    if _REF_BAD.search(rev):
        return "a space, a control character or one of ~ ^ : ? * [ \\"
    if rev.startswith("/") or rev.endswith(("/", ".", ".lock")):
        return "a leading '/', or a trailing '/', '.' or '.lock'"
    if any(part.startswith(".") or part.endswith(".lock") for part in rev.split("/")):
        return "a path component starting with '.' or ending in '.lock'"
    return None


@dataclass(frozen=True)
class HubModel:
    """A parsed ``hf://`` reference: the repository id and the revision asked for."""

    repo_id: str
    revision: str


def parse_hub_spec(value: str) -> HubModel:
    """``hf://org/repo@revision`` -> :class:`HubModel`; anything else is a :class:`FidelityError`."""
    m = _SPEC.match(value)
    if m is None:
        raise FidelityError(f"expected a Hub model like 'hf://org/repo@revision', found {value!r}")
    repo_id, rev = m.group(1), m.group(2)
    problem = hub_id_problem(repo_id)
    if problem:
        raise FidelityError(f"expected a Hub model like 'hf://org/repo@revision', found {value!r}: its repository id "
                            f"{repo_id!r} is not org/name of letters, digits, '-', '_', '.' ({problem})")
    if rev is not None:
        problem = ref_name_problem(rev)
        if problem:
            raise FidelityError(f"expected a Hub model like 'hf://org/repo@revision', found {value!r}: its revision "
                                f"{rev!r} is neither a commit hash nor a Git ref name (git check-ref-format: {problem})")
    return HubModel(repo_id, rev or "main")


def resolve_hub_model(value: str) -> Path:
    """The local snapshot folder of ``hf://org/repo@revision`` (downloaded unless cached or offline)."""
    spec = parse_hub_spec(value)
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        snap = Path(snapshot_download(repo_id=spec.repo_id, revision=spec.revision))
    except LocalEntryNotFoundError:
        mode = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        raise FidelityError(f"{value}: expected a snapshot of {spec.repo_id} at revision {spec.revision!r} in the local "
                            f"Hugging Face cache ({constants.HF_HUB_CACHE}) because {mode}, found none; download it "
                            f"first: hf download {spec.repo_id} --revision {spec.revision}") from None
    except (RepositoryNotFoundError, RevisionNotFoundError, HfHubHTTPError) as exc:
        raise FidelityError(f"{value}: the Hub refused it: {str(exc).splitlines()[0]}") from None
    verify_snapshot(snap)
    return snap


def git_blob_sha1(path: Path) -> str:
    """The Git blob hash of a file: sha1 of ``blob <size>\\0`` followed by its bytes (what Git names it by)."""
    return file_hexdigest(path, "sha1", prefix=f"blob {path.stat().st_size}\0".encode())


def snapshot_blobs(snap: Path) -> dict[str, str]:
    """``{file: blob name}`` of a cache snapshot: every file must be a link into the repository's ``blobs/``
    whose name is a sha256 (LFS) or a Git blob hash; anything else is refused naming the file."""
    blobs = (snap.parent.parent / "blobs").resolve()
    out: dict[str, str] = {}
    for p in sorted(snap.rglob("*")):
        if p.is_dir() and not p.is_symlink():
            continue
        rel = p.relative_to(snap).as_posix()
        target = Path(os.path.realpath(p))
        if not p.is_symlink() or target.parent != blobs or not target.is_file():
            raise FidelityError(f"{p}: Hub cache snapshot file: expected a link to a blob in {blobs}, found "
                                f"{'a plain file' if not p.is_symlink() else f'a link to {target}'} (a replaced snapshot)")
        if not (_SHA256.match(target.name) or _COMMIT.match(target.name)):
            raise FidelityError(f"{p}: Hub cache blob name: expected a sha256 (LFS) or a Git blob hash, found {target.name!r}")
        out[rel] = target.name
    return out


def verify_snapshot(snap: Path, known_sha256: dict[str, str] | None = None) -> dict[str, str]:
    """Check every file of the snapshot ``snap`` against the digest its blob is named by (docs/engines.md §"Models by name");
    ``known_sha256`` (``{file: sha256}`` already computed) saves reading those files again. Returns
    :func:`snapshot_blobs`."""
    blobs = snapshot_blobs(snap)
    known = known_sha256 or {}
    for rel, name in blobs.items():
        path = snap / rel
        if _SHA256.match(name):
            found, kind = known.get(rel) or sha256_file(path), "sha256 (an LFS file)"
        else:
            found, kind = git_blob_sha1(path), "Git blob hash"
        if found != name:
            raise FidelityError(f"{path}: content of a Hub cache snapshot file: expected the {kind} its blob is named by, "
                                f"{name}, found {found} (the file was replaced: its bytes are not the repository's)")
    return blobs


def hub_origin(model_dir: Path) -> dict[str, str] | None:
    """``{"repo_id", "commit"}`` when ``model_dir`` is a snapshot of the Hugging Face cache
    (``models--<org>--<name>/snapshots/<commit>``), else None."""
    snap, snapshots, repo = model_dir, model_dir.parent, model_dir.parent.parent
    if snapshots.name != "snapshots" or not repo.name.startswith("models--") or not _COMMIT.match(snap.name):
        return None
    return {"repo_id": repo.name.removeprefix("models--").replace("--", "/"), "commit": snap.name}
