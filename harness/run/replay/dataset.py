"""``fidelity replay --dataset``: score a candidate against a downloaded dataset's reference.

The dataset is verified whole first (:func:`harness.dataset.verify.verify_dataset`). The
candidate is a capture store (``capture.json``) or a transformers model folder, which is captured
on the dataset's suite for the replayed shards. Refused: shards the dataset holds no reference
for, a window its reports do not use, and (through the verification) another protocol version or
head. Scoring is :func:`harness.run.replay.stores.replay`, the same path as inside the project.
"""

from __future__ import annotations

from pathlib import Path

from harness.capture.loop import capture
from harness.dataset.verify import verify_dataset
from harness.engines.base import EngineOptions
from harness.errors import FidelityError, VerificationError
from harness.inputs.dataset_layout import MANIFEST
from harness.inputs.suite import Suite
from harness.io.atomic import refuse_overwriting_inputs, removed_on_failure


def replay_dataset(dataset: Path, candidate: Path, out: Path, *, shards: str | None = None, score_from: int = 0,
                   name: str | None = None, n_boot: int = 10_000, device: str = "cpu") -> list[Path]:
    """Verify ``dataset``, obtain the candidate's capture, score the reference shards; returns report paths."""
    from harness.run.replay.stores import default_name, replay

    doc = verify_dataset(dataset)
    held = list(doc["reference"]["shards"])
    suite = Suite.load(dataset / "suite", verify=True)
    wanted = held if shards is None else suite.parse_shards(shards)
    lacking = [k for k in wanted if k not in held]
    if lacking:
        raise VerificationError(dataset / MANIFEST, "reference.shards (shards this dataset can replay)", held, lacking)
    if doc["score_from"] and score_from not in doc["score_from"]:
        raise VerificationError(dataset / MANIFEST, "score_from (the window of the dataset's reports)", doc["score_from"], score_from)
    store = candidate
    if not (candidate / "capture.json").is_file():
        if not (candidate / "config.json").is_file():
            raise FidelityError(f"{candidate}: neither a capture store (capture.json) nor a model folder (config.json)")

        store = out / "capture"

    # never inside the dataset or the candidate (a capture there would corrupt them)
    refuse_overwriting_inputs([out], [dataset, candidate], "replay --dataset --out")
    with removed_on_failure(out, out / "capture"):  # a refused replay leaves no capture it made
        if store != candidate:
            capture("transformers", candidate, suite, store, shards=wanted, progress=False, options=EngineOptions(device=device))
        return replay(dataset / "suite", dataset / "reference", store, dataset / "head" / "lm_head.safetensors", out,
                      shards=",".join(map(str, wanted)), score_from=score_from, n_boot=n_boot, device=device,
                      candidate_name=name or default_name(candidate), reference_name=doc["reference"]["name"])
