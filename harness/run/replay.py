"""``fidelity replay``: the command-line twin of one pytest case, on stored captures.

Everything is verified before anything is scored, and nothing is written until every
selected shard has been scored and its report rendered:

1. the suite (``Suite.load(verify=True)``: manifest, token and shard hashes, ids < vocab);
2. the reference and candidate stores, every file content-verified (``verify_all``: sha256,
   embedded index and suite hash, tensor name, dtype, shape, finite values), of one kind;
3. the shared head (and the candidate's own head, if given): sha256 against its sidecar,
   ``weight`` bf16 2-D finite, vocab >= the suite's tokenizer vocab, hidden size equal to the
   hidden-state stores' width (logits stores: equal widths >= the suite's vocab);
4. the shard list (in range) and that both stores hold every context of every selected shard;
   the window ``score_from`` leaves at least one scored row per context.

Output (``--out``):

* one shard and ``--out`` ending in ``.json``: that shard's report (``X.json`` + ``X.md``);
* otherwise ``--out`` is a folder and each selected shard is written as ``shard-NN.json`` +
  ``shard-NN.md`` in it — the layout the pytest plugin uses for ``<report-dir>/<candidate>/``,
  so replayed reports can be aggregated with (or diffed against) the plugin's.

Every file is written atomically (temporary file + rename) and only after all reports have been
rendered, so a refusal — any ``FidelityError`` — leaves no report file behind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from harness.errors import FidelityError, VerificationError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class ReplayInputs:
    """Verified inputs of one replay."""

    suite: Any
    reference: Any
    candidate: Any
    head: Any
    cand_head: Any
    shards: list[int]


def _default_name(path: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", path.resolve().name).lstrip("._+-")
    return name or "candidate"


def _check_head(head: Any, suite: Any, width: int | None, store_root: Path) -> None:
    if head.vocab_size < suite.vocab_size:
        raise VerificationError(head.path, "head vocab_size (>= the suite's tokenizer vocab)", f">= {suite.vocab_size}", head.vocab_size)
    if width is not None and head.hidden_size != width:
        raise VerificationError(head.path, f"head hidden_size (the width of {store_root / 'capture.json'})", width, head.hidden_size)


def verify_inputs(
    suite_path: str | Path,
    reference_path: str | Path,
    candidate_path: str | Path,
    head_path: str | Path,
    *,
    cand_head_path: str | Path | None = None,
    shards: str | None = None,
    score_from: int = 0,
) -> ReplayInputs:
    """Load and verify every input of a replay (module docstring, steps 1-4)."""
    from harness.inputs.head import load_head
    from harness.capture.store import MANIFEST, CaptureStore
    from harness.inputs.suite import Suite

    suite = Suite.load(suite_path, verify=True)
    if not 0 <= score_from < suite.n_ctx - 1:
        raise VerificationError(suite.root / "suite.json", "--window (score_from)", f"0..{suite.n_ctx - 2} (n_ctx {suite.n_ctx})", score_from)
    shard_list = suite.parse_shards(shards)
    reference = CaptureStore.open(reference_path, suite, verify=True)
    candidate = CaptureStore.open(candidate_path, suite, verify=True)
    if reference.kind != candidate.kind:
        raise VerificationError(candidate.root / MANIFEST, "kind (same as the reference store)", reference.kind, candidate.kind)
    if candidate.width != reference.width:
        field = "hidden_size" if reference.kind == "hidden_states" else "vocab_size"
        raise VerificationError(candidate.root / MANIFEST, f"{field} (same as the reference store)", reference.width, candidate.width)
    wanted = [i for k in shard_list for i in suite.shard_indices(k)]
    for store in (reference, candidate):
        missing = store.missing(wanted)
        if missing:
            raise VerificationError(
                store.root / MANIFEST, f"contexts of shard(s) {','.join(map(str, shard_list))}", "all captured",
                f"{len(missing)} missing (first: {missing[0]})", "capture them with `fidelity capture --shards ...`",
            )
    head = load_head(head_path)
    hidden = reference.width if reference.kind == "hidden_states" else None
    _check_head(head, suite, hidden, reference.root)
    cand_head = None
    if cand_head_path is not None:
        cand_head = load_head(cand_head_path)
        _check_head(cand_head, suite, hidden, candidate.root)
    if reference.kind == "logits" and reference.width < suite.vocab_size:
        raise VerificationError(reference.root / MANIFEST, "vocab_size (>= the suite's tokenizer vocab)", f">= {suite.vocab_size}", reference.width)
    reference.verify_all()
    candidate.verify_all()
    return ReplayInputs(suite, reference, candidate, head, cand_head, shard_list)


def output_paths(out: str | Path, candidate: str, shards: Sequence[int]) -> list[Path]:
    """Report JSON paths for ``shards`` under ``--out`` (see the module docstring)."""
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
) -> list[Path]:
    """Verify, score every selected shard, then write the reports; returns the JSON paths."""
    from harness.io.atomic import atomic_write_text, dumps_json
    from harness.reports.shard import render_markdown
    from harness.run.shard import score_shard

    name = candidate_name or _default_name(Path(candidate_path))
    for what, value in (("--name", name), ("--reference-name", reference_name)):
        if not _NAME_RE.match(value):
            raise FidelityError(f"{what}: expected letters, digits, '.', '_', '+', '-' starting alphanumeric, found {value!r}")
    inputs = verify_inputs(suite_path, reference_path, candidate_path, head_path, cand_head_path=cand_head_path,
                           shards=shards, score_from=score_from)
    paths = output_paths(out, name, inputs.shards)
    rendered: list[tuple[Path, str, str]] = []
    for shard, path in zip(inputs.shards, paths):
        report = score_shard(
            suite=inputs.suite, shard=shard, reference=inputs.reference, candidate=inputs.candidate,
            head=inputs.head, cand_head=inputs.cand_head, reference_name=reference_name, candidate_name=name,
            candidate_meta={"size_bytes": None, "tags": []}, score_from=score_from, n_boot=n_boot, device=device,
        )
        try:
            text = dumps_json(report.to_json_dict())
        except ValueError as e:  # NaN/Inf in a metric: never write it
            raise VerificationError(path, f"report values ({e})", "finite numbers", "NaN/Inf") from None
        rendered.append((path, text, render_markdown(report)))
    for path, text, md in rendered:
        atomic_write_text(path, text)
        atomic_write_text(path.with_suffix(".md"), md)
    return [p for p, _t, _m in rendered]
