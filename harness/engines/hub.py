"""Models by name: ``model = "hf://org/repo@revision"`` resolved to a local snapshot with huggingface_hub.

``hf://<org>/<name>[@<revision>]`` (revision: a branch, a tag or a commit; ``main`` when absent) is resolved
with :func:`huggingface_hub.snapshot_download`, which honours ``HF_HUB_OFFLINE`` (no network: the snapshot
must already be in the cache, found through ``refs/<revision>`` or by its commit) and the local cache
(``HF_HUB_CACHE`` / ``HF_HOME``): a model already downloaded is never fetched again. The result is the
snapshot folder ``.../models--<org>--<name>/snapshots/<commit>``, used as any local model folder, and the
candidate's identity (:func:`harness.engines.identity.model_identity`) records the repository and the
resolved commit beside the files' sha256 (:func:`hub_origin`), so "the model I measured" is a commit of a
named repository, not a path on someone's disk. Pin a commit for a measurement that can be repeated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import FidelityError

PREFIX = "hf://"
_SPEC = re.compile(r"^hf://([A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+)(?:@([^\s@]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HubModel:
    """A parsed ``hf://`` reference: the repository id and the revision asked for."""

    repo_id: str
    revision: str


def is_hub_spec(value: str) -> bool:
    return value.startswith(PREFIX)


def parse_hub_spec(value: str) -> HubModel:
    """``hf://org/repo@revision`` -> :class:`HubModel`; anything else is a :class:`FidelityError`."""
    m = _SPEC.match(value)
    if m is None:
        raise FidelityError(f"expected a Hub model like 'hf://org/repo@revision', found {value!r}")
    return HubModel(m.group(1), m.group(2) or "main")


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
        return Path(snapshot_download(repo_id=spec.repo_id, revision=spec.revision))
    except LocalEntryNotFoundError:
        mode = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        raise FidelityError(f"{value}: expected a snapshot of {spec.repo_id} at revision {spec.revision!r} in the local "
                            f"Hugging Face cache ({constants.HF_HUB_CACHE}) because {mode}, found none; download it "
                            f"first: hf download {spec.repo_id} --revision {spec.revision}") from None
    except (RepositoryNotFoundError, RevisionNotFoundError, HfHubHTTPError) as exc:
        raise FidelityError(f"{value}: the Hub refused it: {str(exc).splitlines()[0]}") from None


def hub_origin(model_dir: Path) -> dict[str, str] | None:
    """``{"repo_id", "commit"}`` when ``model_dir`` is a snapshot of the Hugging Face cache
    (``models--<org>--<name>/snapshots/<commit>``), else None."""
    snap, snapshots, repo = model_dir, model_dir.parent, model_dir.parent.parent
    if snapshots.name != "snapshots" or not repo.name.startswith("models--") or not _COMMIT.match(snap.name):
        return None
    return {"repo_id": repo.name.removeprefix("models--").replace("--", "/"), "commit": snap.name}
