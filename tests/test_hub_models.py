"""Models by name: ``model = "hf://org/repo@revision"`` resolved offline from a Hugging Face cache the test
builds (the cache's real layout: ``blobs/``, ``refs/<branch>``, ``snapshots/<commit>/`` of links to blobs)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.engines.hub import hub_origin, parse_hub_spec
from harness.engines.identity import model_identity
from harness.inputs.config import ConfigError, load_config

COMMIT = "3f1c2b9a" + "0" * 32


def hub_cache(cache: Path, repo_id: str, model: Path, commit: str = COMMIT, branch: str = "main") -> Path:
    """Put ``model``'s files into ``cache`` as huggingface_hub lays a download out; returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(model.iterdir()):
        data = f.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snap / f.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / branch).write_text(commit)
    return snap





def test_spec_parsing() -> None:
    spec = parse_hub_spec("hf://acme/tiny-good@v1.0")
    assert (spec.repo_id, spec.revision) == ("acme/tiny-good", "v1.0")
    assert (parse_hub_spec("hf://acme/m").repo_id, parse_hub_spec("hf://acme/m").revision) == ("acme/m", "main")
    for bad in ("hf://acme", "hf://acme/m@", "hf:///m", "hf://a/b/c"):
        with pytest.raises(Exception, match="expected a Hub model like 'hf://org/repo@revision'"):
            parse_hub_spec(bad)


def test_candidate_by_name_resolves_offline_with_the_commit_in_its_identity(project_with_model: Callable[[Path, str], Path], offline_cache: Path, fidelity_project: Path,
                                                                            tmp_path: Path) -> None:
    source = fidelity_project / "models" / "good"
    snap = hub_cache(offline_cache, "acme/tiny-good", source)
    for spec in ("hf://acme/tiny-good@main", f"hf://acme/tiny-good@{COMMIT}", "hf://acme/tiny-good"):
        toml = project_with_model(tmp_path / spec.rsplit("@", 1)[-1][:8].replace("/", "_"), spec)
        cand = load_config(toml).candidate("good")
        assert cand.model == snap
    ident = model_identity(snap)
    assert {k: ident["hub"][k] for k in ("repo_id", "commit")} == {"repo_id": "acme/tiny-good", "commit": COMMIT}
    assert ident["hub"]["blobs"]["config.json"] == ident["config_sha256"]  # this cache names every blob by sha256
    local = model_identity(source)  # the same bytes: the same weights and config by sha256
    assert ident["weights"] == local["weights"] and ident["config_sha256"] == local["config_sha256"]
    assert "hub" not in local and hub_origin(source) is None


def test_a_revision_not_in_the_cache_is_refused_offline(project_with_model: Callable[[Path, str], Path], offline_cache: Path, fidelity_project: Path, tmp_path: Path) -> None:
    hub_cache(offline_cache, "acme/tiny-good", fidelity_project / "models" / "good")
    toml = project_with_model(tmp_path / "p", "hf://acme/tiny-good@v2")
    with pytest.raises(ConfigError, match=r"candidates\[0\]\.model: hf://acme/tiny-good@v2: expected a snapshot of "
                                          r"acme/tiny-good at revision 'v2' in the local Hugging Face cache .* because "
                                          r"HF_HUB_OFFLINE is set, found none; download it first: hf download"):
        load_config(toml)


@pytest.mark.slow  # captures and scores the candidate of the tiny project
def test_a_candidate_given_as_a_hub_id_runs_offline_from_the_cache(project_with_model: Callable[[Path, str], Path], fidelity_project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "hf-cache"
    hub_cache(cache, "acme/tiny-good", fidelity_project / "models" / "good")
    project_with_model(tmp_path / "p", "hf://acme/tiny-good@main")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "-q", "-p", "no:cacheprovider", "-m", "fidelity",
                          "-k", "good", "--fidelity-update-baselines"], cwd=tmp_path / "p", env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "4 passed" in out.stdout
    report = json.loads((tmp_path / "p" / "fidelity-reports" / "good" / "shard-00.json").read_text())
    ident = report["comparability"]["candidate"]["identity"]
    assert {k: ident["hub"][k] for k in ("repo_id", "commit")} == {"repo_id": "acme/tiny-good", "commit": COMMIT}
    assert ident["weights"] == model_identity(fidelity_project / "models" / "good")["weights"]
