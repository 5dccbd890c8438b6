"""Identity in the gate: a baseline records the candidate's identity and the gate checks it; two
candidates of one identity are reported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# ----------------------------------------------------------------------------- 7. identity in the gate


def _scored(identity: dict[str, Any], mean: float = 0.001) -> Any:
    from types import SimpleNamespace

    from harness.gate.baselines import Headline

    return SimpleNamespace(candidate="good", shard=0, headline=Headline(mean, mean / 2, mean * 2, mean * 5, 0.99),
                           report=SimpleNamespace(comparability={"candidate": {"name": "good", "identity": identity}}))


MODEL_A = {"name": "good", "config_sha256": "a" * 64, "weights": {"model.safetensors": "b" * 64}}
MODEL_B = {"name": "good", "config_sha256": "a" * 64, "weights": {"model.safetensors": "c" * 64}}


def test_baseline_records_the_identity_and_the_gate_checks_it(tmp_path: Path) -> None:
    """The baseline records the sha256 of the candidate's content identity (the folder name left out); a
    case of another model under the same name fails naming the file, the expected and the found identity,
    even when its numbers pass; the same model in another folder passes."""
    from harness.gate.baselines import Baseline, Headline, identity_sha256, write_baseline
    from harness.gate.gate import Gate

    head = Headline(0.001, 0.0005, 0.002, 0.005, 0.99)
    path = write_baseline(tmp_path, "good", {0: head}, MODEL_A)
    doc = json.loads(path.read_text())
    independent = __import__("hashlib").sha256(json.dumps(
        {"config_sha256": "a" * 64, "weights": {"model.safetensors": "b" * 64}}, sort_keys=True,
        separators=(",", ":")).encode()).hexdigest()
    assert doc["identity"] == {"sha256": independent, "model": "good"} == {"sha256": identity_sha256(MODEL_A), "model": "good"}
    gate = Gate(baselines=tmp_path, update=False, config_path=tmp_path / "fidelity.toml")
    assert gate.failure(_scored(MODEL_A)) is None
    assert gate.failure(_scored({**MODEL_A, "name": "moved-elsewhere"})) is None
    msg = gate.failure(_scored(MODEL_B))
    assert msg is not None and f"good.json: identity: expected {independent[:12]} (good), found " \
        f"{identity_sha256(MODEL_B)[:12]} (good): the candidate is another model" in msg
    assert "--fidelity-update-baselines" in msg
    # an update on purpose records the new identity and drops the other model's entries
    write_baseline(tmp_path, "good", {1: head}, MODEL_B)
    b = Baseline.load(path, "good")
    assert b.identity is not None and b.identity["sha256"] == identity_sha256(MODEL_B) and list(b.shards) == ["01"]


def test_baseline_without_identity_gates_and_a_malformed_identity_is_refused(tmp_path: Path) -> None:
    """A baseline written before identities were recorded still gates on its thresholds (the run names it);
    an identity that is not a sha256 is refused naming the file and the key."""
    from harness.gate.baselines import Baseline, BaselineError
    from harness.gate.gate import Gate

    (tmp_path / "good.json").write_text(json.dumps({"schema": "fidelity.baseline/1", "candidate": "good",
                                                    "default": {"max_mean_kld": 0.0005}}))
    msg = Gate(baselines=tmp_path, update=False, config_path=tmp_path / "f.toml").failure(_scored(MODEL_A))
    assert msg is not None and "mean_kld 0.001 > max 0.0005" in msg
    (tmp_path / "good.json").write_text(json.dumps({"schema": "fidelity.baseline/1", "candidate": "good",
                                                    "identity": {"sha256": "xyz"}, "default": {}}))
    with pytest.raises(BaselineError, match=r"good\.json: identity: expected \{sha256: 64 hex digits"):
        Baseline.load(tmp_path / "good.json", "good")


def test_two_candidates_of_one_identity_are_reported() -> None:
    """Two candidates that are one model by content through one engine are named; the same model through
    two engines is two measurements and is not."""
    from harness.plugin.ladder import same_identity_groups

    hf, vllm = {"name": "transformers"}, {"name": "vllm"}
    groups = same_identity_groups({
        "a": {"model": MODEL_A, "engine": hf}, "a_copy": {"model": {**MODEL_A, "name": "copy"}, "engine": hf},
        "a.vllm": {"model": MODEL_A, "engine": vllm}, "b": {"model": MODEL_B, "engine": hf}})
    assert groups == [["a", "a_copy"]]
