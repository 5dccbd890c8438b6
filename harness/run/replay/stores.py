"""``fidelity replay``: the command-line twin of one pytest case, on stored captures.

Reasoning: docs/design.md §"Replay on stored captures".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.capture.store import CaptureStore
from harness.errors import FidelityError, UsageError, VerificationError
from harness.inputs.config import name_problem
from harness.inputs.head import HeadTensor, load_head, sidecar_path
from harness.inputs.suite import Suite
from harness.interchange.published_method import method_report, render_method_markdown
from harness.interchange.suite_manifest import shard_view_digest
from harness.io.atomic import atomic_write_files, dumps_json, refuse_overwriting_inputs
from harness.io.jsonio import JSONObject
from harness.reports.report_dir import STAMP, is_shard_report
from harness.reports.report_folder import ReportFolder, check_for_writing
from harness.reports.shard import render_markdown
from harness.run.shard import CandidateMeta, score_shard
from harness.run.shard_inputs import ShardInputs
from harness.run.verify import verify_joins


@dataclass(frozen=True)
class ReplayInputs:
    """Verified inputs of one replay: every selected shard has passed the joins."""

    suite: Suite
    reference: CaptureStore
    candidate: CaptureStore
    head: HeadTensor | None
    cand_head: HeadTensor | None
    shards: list[int]

    def shard_inputs(self, shard: int, score_from: int = 0) -> ShardInputs:
        """The inputs of one selected shard (already verified with the others)."""
        return ShardInputs(suite=self.suite, shard=shard, reference=self.reference, candidate=self.candidate,
                           head=self.head, cand_head=self.cand_head, score_from=score_from)


def default_name(path: Path) -> str:
    """A candidate name from a store or model folder's name: other characters than the name rule's become ``_``."""
    name = re.sub(r"[^A-Za-z0-9._+]", "_", path.resolve().name).lstrip("._+")
    return name or "candidate"


def verify_inputs(
    suite_path: str | Path,
    reference_path: str | Path,
    candidate_path: str | Path,
    head_path: str | Path | None,
    *,
    cand_head_path: str | Path | None = None,
    shards: str | None = None,
    score_from: int = 0,
    reference_model: str | Path | None = None,
) -> ReplayInputs:
    """Load and verify every input of a replay (docs/design.md §"Replay on stored captures", steps 1-4); the joins between
    them are checked by :func:`harness.run.verify.verify_joins`, as in a pytest run."""
    suite = Suite.load(suite_path, verify=True)
    shard_list = suite.parse_shards(shards)
    reference = CaptureStore.open(reference_path, suite, verify=True)
    candidate = CaptureStore.open(candidate_path, suite, verify=True)
    head = load_head(head_path) if head_path is not None else None
    cand_head = load_head(cand_head_path) if cand_head_path is not None else None
    verify_joins(suite=suite, reference=reference, candidate=candidate, head=head, cand_head=cand_head,
                 score_from=score_from, shards=shard_list,
                 reference_model=None if reference_model is None else Path(reference_model))
    reference.verify_all()
    candidate.verify_all()
    return ReplayInputs(suite, reference, candidate, head, cand_head, shard_list)


def output_paths(out: str | Path, candidate: str, shards: Sequence[int]) -> list[Path]:
    """Report JSON paths for ``shards`` under ``--out`` (see docs/design.md §"Replay on stored captures")."""
    out = Path(out)
    if out.suffix == ".json":
        if len(shards) != 1:
            raise FidelityError(
                f"{out}: --out names one JSON file but {len(shards)} shards are selected: "
                "pass a folder, or select one shard with --shards N"
            )
        return [out]
    if out.exists() and not out.is_dir():
        raise FidelityError(f"{out}: --out exists and is not a folder")
    return [out / f"shard-{s:02d}.json" for s in shards]


def replay(
    suite_path: str | Path,
    reference_path: str | Path,
    candidate_path: str | Path,
    head_path: str | Path,
    out: str | Path,
    *,
    cand_head_path: str | Path | None = None,
    shards: str | None = None,
    score_from: int = 0,
    n_boot: int = 10_000,
    device: str = "cpu",
    candidate_name: str | None = None,
    reference_name: str = "reference",
    reference_model: str | Path | None = None,
    method: str = "exact",
) -> list[Path]:
    """Verify, score every selected shard, then write the reports; returns the JSON paths."""
    name = candidate_name or default_name(Path(candidate_path))
    for what, value, allowed in (("--name", name, "'.', '_', '+'"), ("--reference-name", reference_name, "'.', '_', '+', '-'")):
        problem = name_problem(value, reference=what == "--reference-name")  # the configuration's own rule
        if problem:
            raise UsageError(f"{what}: expected letters, digits, {allowed} starting alphanumeric and a portable file "
                             f"name, found {value!r} ({problem})")
    own_inputs = [Path(suite_path), Path(reference_path), Path(candidate_path)]
    for h in (head_path, cand_head_path):
        if h is not None:
            own_inputs += [Path(h), sidecar_path(h)]
    out_p = Path(out)
    refuse_overwriting_inputs([out_p, out_p.with_suffix(".md")] if out_p.suffix == ".json" else [out_p], own_inputs, "replay --out")
    inputs = verify_inputs(suite_path, reference_path, candidate_path, head_path, cand_head_path=cand_head_path,
                           shards=shards, score_from=score_from, reference_model=reference_model)
    return write_replay(inputs, out, name=name, reference_name=reference_name, score_from=score_from, n_boot=n_boot,
                        device=device, own_inputs=own_inputs, method=method)


def write_replay(inputs: ReplayInputs, out: str | Path, *, name: str, reference_name: str, score_from: int = 0,
                 n_boot: int = 10_000, device: str = "cpu", own_inputs: Sequence[Path] = (),
                 custody: JSONObject | None = None, method: str = "exact") -> list[Path]:
    """Score every shard of verified ``inputs``, then write all reports at once; returns the JSON paths.

    ``custody``: the published digests of a dataset read in another layout, kept in every report's
    comparability block. ``method="published"``: write, instead of this project's shard reports, the
    published tool's figures for the same positions (:mod:`harness.interchange.published_method`),
    each with the exact figures and the difference beside them (``report-<name>-shard-NNNN.json`` + ``.md``)."""
    if method not in ("exact", "published"):
        raise FidelityError(f"--method: expected exact or published, found {method!r}")
    paths = output_paths(out, name, inputs.shards)
    if method == "published" and Path(out).suffix != ".json":
        paths = [Path(out) / f"report-{name}-shard-{s:04d}.json" for s in inputs.shards]
    refuse_overwriting_inputs([q for p in paths for q in (p, p.with_suffix(".md"))], own_inputs, "replay --out")
    folder = report_folder_of(paths, inputs.suite.suite_token_sha256, name)
    files: dict[Path, str] = {}
    for shard, path in zip(inputs.shards, paths):
        meta: CandidateMeta = {"size_bytes": None, "tags": [], "bits_per_weight": None}  # a store: no checkpoint
        report = score_shard(inputs.shard_inputs(shard, score_from), reference_name=reference_name, candidate_name=name,
                             candidate_meta=meta, n_boot=n_boot, device=device, custody=custody)
        if method == "published":
            if inputs.head is None:
                raise FidelityError("--method published scores hidden states through the shared head: pass --head")

            doc = method_report(suite=inputs.suite, shard=shard, reference=inputs.reference, candidate=inputs.candidate,
                                head=inputs.head, cand_head=inputs.cand_head, exact=report, score_from=score_from,
                                view_digest=shard_view_digest(inputs.suite, shard))
            files[path] = dumps_json(doc)
            files[path.with_suffix(".md")] = render_method_markdown(doc)
            continue
        try:
            text = dumps_json(report.to_json_dict())
        except ValueError as e:  # NaN/Inf in a metric: never write it
            raise VerificationError(path, f"report values ({e})", "finite numbers", "NaN/Inf") from None
        files[path] = text
        files[path.with_suffix(".md")] = render_markdown(report)
    atomic_write_files(files)  # every report of the run, or none of them
    if folder is not None:
        ReportFolder(path=folder, suite_sha256=inputs.suite.suite_token_sha256, command="fidelity replay").record(files)
    return list(paths)


def report_folder_of(paths: Sequence[Path], suite_sha256: str, name: str) -> Path | None:
    """The report folder (one a run or a command stamped) that the replay's ``paths`` go into, checked for
    writing this suite's shard reports of candidate ``name``: the folder the files go into or its parent.
    None where neither is stamped (plain files: no stamp is made). Into a report folder only its own layout
    is written (``<name>/shard-NN.json``, what its ledger can list); anything else is a
    :class:`~harness.errors.UsageError` naming the stamp, the expected and the found path."""
    where = paths[0].parent
    for folder in (where, where.parent):
        if check_for_writing(folder, suite_sha256, option="--out") is None:
            continue
        expected = f"{name}/shard-NN.json"
        for p in paths:
            rel = p.relative_to(folder).as_posix()
            if rel != f"{name}/{p.name}" or p.suffix != ".json" or not is_shard_report(rel):
                raise UsageError(f"{folder / STAMP}: replay --out inside a report folder: expected {expected} "
                                 f"(--out {folder / name}), found {rel}")
        return folder
    return None
