"""``fidelity replay --dataset`` on a dataset in the published layout (:mod:`harness.interchange`).

The dataset is read in place and verified whole (suite, token files, shard views, pin, head,
every reference file); the candidate is one of: a capture store of this project (``capture.json``,
captured on the same token ids), a published capture folder (``capture-manifest.json``, e.g. the
dataset's own ``captures/shard-0000/hidden-<name>``), or a transformers model folder, captured on the
dataset's suite for the replayed shards. Refused: shards the dataset holds no reference for. Scoring
and writing are :func:`harness.run.replay.stores.write_replay`, the path of every other replay; each report
carries the dataset's published digests as ``comparability.custody``.
"""

from __future__ import annotations

from pathlib import Path

from harness.capture.loop import capture
from harness.capture.store import CaptureStore
from harness.engines.base import EngineOptions
from harness.errors import FidelityError, VerificationError
from harness.inputs.interchange_layout import CAPTURE_MANIFEST, scan_layout
from harness.interchange.dataset import PublishedDataset, open_published
from harness.run.replay.stores import ReplayInputs, write_replay
from harness.run.verify import verify_joins


def open_candidate(dataset: PublishedDataset, candidate: Path, out: Path, shards: list[int], device: str,
                   name: str) -> CaptureStore:
    """The candidate's store (module docstring): a project store, a published folder, or a captured model."""
    if (candidate / "capture.json").is_file():
        return CaptureStore.open(candidate, dataset.suite, verify=True)
    if (candidate / CAPTURE_MANIFEST).is_file() or any(candidate.rglob(CAPTURE_MANIFEST)):
        return dataset.capture_store(candidate, name)
    if not (candidate / "config.json").is_file():
        raise FidelityError(f"{candidate}: expected a capture store (capture.json), a published capture folder "
                            f"({CAPTURE_MANIFEST}) or a model folder (config.json), found none of them")
    store = out / "capture"
    capture("transformers", candidate, dataset.suite, store, shards=shards, options=EngineOptions(device=device), progress=False)
    return CaptureStore.open(store, dataset.suite, verify=True)


def replay_published(dataset_path: Path, candidate: Path, out: Path, *, head: Path | None = None, shards: str | None = None,
                     score_from: int = 0, name: str | None = None, n_boot: int = 10_000, device: str = "cpu",
                     method: str = "exact") -> list[Path]:
    """Verify the published dataset, obtain the candidate's capture, score the reference shards; returns report paths."""
    scan = scan_layout(dataset_path, head)
    ds = open_published(scan)
    held = list(ds.reference_shards)
    wanted = held if shards is None else ds.suite.parse_shards(shards)
    lacking = [k for k in wanted if k not in held]
    if lacking:
        raise VerificationError(dataset_path / "reference", "shards this dataset holds a reference for", held, lacking,
                                "; ".join(scan.gaps[k] for k in lacking if k in scan.gaps) or None)
    cname = name or candidate.resolve().name
    store = open_candidate(ds, candidate, out, wanted, device, cname)
    if shards is None:  # by default the reference shards the candidate holds (all of them for a model captured here)
        wanted = [k for k in held if not store.missing(ds.suite.shard_indices(k))] or held
    verify_joins(suite=ds.suite, reference=ds.reference, candidate=store, head=ds.head,
                 score_from=score_from, shards=wanted)
    ds.reference.verify_all()
    store.verify_all()
    inputs = ReplayInputs(ds.suite, ds.reference, store, ds.head, None, wanted)
    return write_replay(inputs, out, name=cname, reference_name=str(ds.reference.identity["name"]), score_from=score_from,
                        n_boot=n_boot, device=device, own_inputs=[dataset_path, candidate], custody=ds.custody,
                        method=method)
