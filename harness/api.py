"""The Python API: a configuration's ladder, a model's capture and one shard's report (docs/api.md).

Thin over the machinery the command line and the plugin run: :func:`run_ladder` is ``fidelity ladder``,
:func:`capture` is ``fidelity capture``, :func:`score` is one shard of ``fidelity replay`` (every input
verified first); the numbers are theirs. Errors are :class:`harness.errors.FidelityError` with the same
one-line messages the command prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.capture.loop import capture as _capture
from harness.engines.base import EngineOptions
from harness.reports.aggregate import LadderRow
from harness.reports.shard import ShardReport
from harness.run.ladder_run import run_ladder as _run
from harness.run.replay.stores import verify_inputs
from harness.run.shard import CandidateMeta, score_shard

__all__ = ["Ladder", "LadderEntry", "capture", "run_ladder", "score"]


@dataclass(frozen=True)
class LadderEntry:
    """One candidate's row of the ladder (its shards aggregated), as ``ladder.json`` holds it."""

    candidate: str
    #: Mean full-vocabulary KL divergence KL(reference || candidate) per scored position, nats.
    mean_kld: float
    #: The 95 % cluster-bootstrap interval of ``mean_kld``; None when too few source clusters to estimate one.
    ci95: tuple[float, float] | None
    #: Fraction of positions where the candidate's top-1 token is the reference's.
    top1: float
    #: Largest per-position KL divergence, nats.
    max_kld: float
    n_positions: int
    shards: tuple[int, ...]
    #: The candidate's weight bytes, when known.
    size_bytes: int | None
    #: "pass", "FAIL (k/n)", "no baseline", or "—" (not gated).
    verdict: str
    #: The whole row as written to ``ladder.json`` (p99 bounds, diagnostics, the aggregate).
    row: LadderRow

    @classmethod
    def from_row(cls, row: LadderRow) -> LadderEntry:
        ci = row["ci95"]
        return cls(candidate=row["candidate"], mean_kld=float(row["mean_kld"]),
                   ci95=None if ci is None else (float(ci[0]), float(ci[1])), top1=float(row["top1"]),
                   max_kld=float(row["max_kld"]), n_positions=int(row["n_positions"]), shards=tuple(row["shards"]),
                   size_bytes=row["size_bytes"], verdict=str(row["verdict"]), row=row)


@dataclass(frozen=True)
class Ladder:
    """What :func:`run_ladder` measured: the entries best first, and what it wrote or could not do."""

    entries: tuple[LadderEntry, ...]
    #: Where the shard reports and ladder.md / ladder.json were written.
    report_dir: Path
    #: ``"<candidate> shard NN: <reason>"`` for each case that failed (capture, scoring or its baseline).
    failures: tuple[str, ...]
    #: ``"<candidate>: <reason>"`` for candidates not run (their engine is not installed).
    skipped: tuple[str, ...]
    #: What the caches served instead of computing (``capture cache: reused 8 of 8 contexts (...)``).
    reused: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """Every case passed its baseline (what ``fidelity ladder``'s exit status 0 means)."""
        return not self.failures

    def entry(self, candidate: str) -> LadderEntry:
        """The entry of ``candidate``; KeyError naming the candidates measured when it has none."""
        for e in self.entries:
            if e.candidate == candidate:
                return e
        raise KeyError(f"{candidate!r} is not in the ladder (measured: {', '.join(e.candidate for e in self.entries)})")


def run_ladder(config: str | Path, *, out: str | Path = "fidelity-reports", candidates: str | None = None,
               shards: str | None = None, device: str = "auto", window: int = 0, executor: str = "serial",
               progress: Callable[[str], None] | None = None) -> Ladder:
    """Score, gate and report every selected candidate x shard of ``config`` (a fidelity.toml), as
    ``fidelity ladder CONFIG --out OUT`` does, writing the same files; ``candidates`` e.g. ``"int8,int4_g32"``,
    ``shards`` e.g. ``"0,2-3"``; ``progress`` receives one line per case."""
    done = _run(Path(config), report_dir=Path(out), executor=executor, candidates=candidates, shards=shards,
                device=device, window=window, progress=progress, command=f"harness.api.run_ladder({str(config)!r})")
    return Ladder(entries=tuple(LadderEntry.from_row(r) for r in done.rows), report_dir=done.report_dir,
                  failures=tuple(done.failures), skipped=tuple(done.skipped), reused=tuple(done.reused))


def capture(model: str | Path, suite: str | Path, out: str | Path, *, shards: str | None = None,
            engine: str = "transformers", device: str = "cpu", progress: bool = False) -> Path:
    """Capture ``model`` (a folder, or a .gguf with ``engine="llamacpp"``) over ``suite`` into the capture store
    ``out`` (created or resumed), as ``fidelity capture`` does; returns ``out``."""
    store = _capture(engine, model, suite, out, shards=shards, options=EngineOptions(device=device), progress=progress)
    return Path(store.root)


def score(reference: str | Path, candidate: str | Path, suite: str | Path, head: str | Path | None, *,
          shard: int = 0, window: int = 0, n_boot: int = 10_000, device: str = "cpu",
          name: str = "candidate", reference_name: str = "reference") -> ShardReport:
    """The shard report of capture store ``candidate`` against capture store ``reference`` on ``shard`` of
    ``suite``, through the shared ``head`` (None for logits stores): what ``fidelity replay --shards N``
    writes, after the same verification (suite, both stores, the head, every join). Nothing is written."""
    inputs = verify_inputs(suite, reference, candidate, head, shards=str(shard), score_from=window)
    meta: CandidateMeta = {"size_bytes": None, "tags": []}
    return score_shard(inputs.shard_inputs(shard, window), reference_name=reference_name, candidate_name=name,
                       candidate_meta=meta, n_boot=n_boot, device=device)
