"""``fidelity ladder``: a configuration's candidate x shard cases without pytest, serially or on a Ray cluster.

The same work as ``pytest fidelity.toml`` minus the report cases: every selected candidate x shard is
scored (in this process, or as a Ray task: :mod:`harness.run.cluster.ray_executor`), gated against its committed
baseline (:class:`harness.gate.gate.Gate`), and written as ``<out>/<candidate>/shard-NN.json`` +
``.md`` as it arrives; then ``ladder.md`` / ``ladder.json``. The shard reports and the ladder are the
ones the pytest run writes for the same selection. The folder is opened as every writer opens it
(:mod:`harness.reports.report_folder`): a folder stamped with another suite is refused before anything is
scored, and what the run wrote is recorded in the folder's ledger. A candidate whose case fails (its capture, scoring or gate) is named with the reason;
the other candidates are unaffected. Tails, windows and pairs are the pytest run's report cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.engines.registry import get_engine
from harness.errors import FidelityError
from harness.gate.baselines import headline_of
from harness.gate.gate import Gate, no_baselines_yet
from harness.inputs.config import FidelityConfig, load_config
from harness.inputs.suite import parse_shard_spec
from harness.interchange.suite_manifest import load_any_suite
from harness.reports.aggregate import LadderRow, NotMeasured, ladder_rows, write_ladder
from harness.reports.report_folder import open_report_folder
from harness.reports.shard import ShardReport
from harness.run.cluster.ray_executor import RayExecutor, parse_executor, scored_shard

__all__ = ["LadderOutcome", "run_ladder"]


@dataclass
class LadderOutcome:
    """What one ``fidelity ladder`` run did."""

    report_dir: Path
    #: Files written (shard reports, then the ladder), in order.
    written: list[Path] = field(default_factory=list)
    #: The ladder's rows (:func:`harness.reports.aggregate.ladder_rows`).
    rows: list[LadderRow] = field(default_factory=list)
    #: ``"<candidate> shard NN: <reason>"`` for every case that failed (capture, scoring or gate).
    failures: list[str] = field(default_factory=list)
    #: ``"<candidate>: <reason>"`` for candidates not run (their engine is not installed).
    skipped: list[str] = field(default_factory=list)
    #: Where the results came from (Ray: host names), empty when serial.
    nodes: list[str] = field(default_factory=list)
    #: What this process's caches served instead of computing (:meth:`harness.run.reuse.ReuseLog.lines`).
    reused: list[str] = field(default_factory=list)
    #: Lines for the end of the run (a first run: how to record the baselines).
    notes: list[str] = field(default_factory=list)


def _select(config: FidelityConfig, candidates: str | None, shards: str | None) -> tuple[FidelityConfig, list[int], list[str]]:
    import dataclasses

    suite = load_any_suite(config.suite, verify=False)
    chosen = parse_shard_spec(shards, len(suite.shards))
    if config.reference_shards is not None:
        chosen = [k for k in chosen if k in config.reference_shards]
    names = candidates.split(",") if candidates else [c.name for c in config.candidates]
    picked = [config.candidate(n) for n in names]  # unknown names: a ConfigError with near matches
    skipped = []
    keep = []
    for cand in picked:
        if cand.model is not None and not get_engine(cand.engine, str(config.path)).available():
            skipped.append(f"{cand.name}: engine {cand.engine!r} is not installed: install it with: "
                           f"{get_engine(cand.engine).install_hint}")
        else:
            keep.append(cand)
    order = [c for c in config.candidates if c in keep]
    return dataclasses.replace(config, candidates=tuple(order), pairs=()), chosen, skipped


def run_ladder(config_path: Path, *, report_dir: Path, executor: str = "serial", candidates: str | None = None,
               shards: str | None = None, device: str = "auto", window: int = 0, score_cache: bool = True,
               progress: Callable[[str], None] | None = None, command: str = "fidelity ladder") -> LadderOutcome:
    """Score, gate and write every selected case (module docstring); ``progress`` receives one line per case;
    ``command``: the command line the folder's ledger records; ``score_cache`` False: nothing read from or kept in
    the scores, summaries and results caches (``--no-score-cache``)."""
    from harness.run.session import FidelitySession, resolve_device

    spec = parse_executor(executor)
    full = load_config(config_path)
    config, chosen, skipped = _select(full if score_cache else dataclasses.replace(full, score_cache=False), candidates, shards)
    suite = load_any_suite(config.suite, verify=False)
    folder = open_report_folder(report_dir, suite.suite_token_sha256, command, config=config.path,
                                entries=[c.name for c in config.candidates])
    cases = [(c.name, s) for c in config.candidates for s in chosen]
    out = LadderOutcome(report_dir=report_dir, skipped=skipped)
    session = FidelitySession(config=config, device=resolve_device(device) if spec.kind == "serial" else device,
                              score_from=window)
    session.plan(cases)
    ray_exec = RayExecutor(spec, config, device=device, score_from=window) if spec.kind == "ray" else None
    gate = Gate(baselines=config.baselines, update=False, config_path=config.path, selector=(str(config_path),))
    reports: list[ShardReport] = []
    verdicts: dict[tuple[str, int], bool] = {}
    first_failure: dict[str, str] = {}
    no_baseline: set[tuple[str, int]] = set()
    try:
        if ray_exec is not None:
            ray_exec.start()
            ray_exec.submit(cases)
        for name, shard in cases:
            try:
                scored = (scored_shard(ray_exec, session, name, shard) if ray_exec is not None
                          else session.score(config.candidate(name), shard))
            except Exception as exc:  # this case fails (a bad candidate); the others go on
                why = str(exc) if isinstance(exc, FidelityError) else f"{type(exc).__name__}: {exc}"
                out.failures.append(f"{name} shard {shard:02d}: {why}")
                first_failure.setdefault(name, why[:300])
                continue
            fresh = gate.fresh()  # a first run: reported, not gated; one line says how to record the baselines
            failure = None if fresh else gate.failure(scored)
            if fresh:
                no_baseline.add((name, shard))
            if failure:
                out.failures.append(f"{name} shard {shard:02d}: {failure}")
            out.written += scored.report.write(report_dir / name / f"shard-{shard:02d}.json")
            reports.append(scored.report)
            verdicts[(name, shard)] = failure is None and not fresh
            if progress is not None:
                h = headline_of(scored.report.metrics)
                progress(f"{name} shard {shard:02d}: mean KLD {h.mean_kld:.6g}, top-1 {h.top1:.4f}, "
                         f"{'not gated' if fresh else 'pass' if failure is None else 'FAIL'}")
    finally:
        if ray_exec is not None:
            ray_exec.shutdown()
            out.nodes = sorted(ray_exec.nodes)
        out.reused = session.reuse.lines()
    if reports:
        out.rows = ladder_rows(reports, verdicts, suite=suite, no_baseline=no_baseline)
        if no_baseline:
            out.notes.append(no_baselines_yet(config.baselines, (str(config_path),)))
        scored_names = {r.candidate for r in reports}
        missing: list[NotMeasured] = [{"candidate": name, "status": "failed", "reason": why} for name, why in first_failure.items()
                   if name not in scored_names]
        missing += [{"candidate": line.split(":", 1)[0], "status": "skipped", "reason": line.split(":", 1)[1].strip()}
                    for line in skipped]
        write_ladder(report_dir, out.rows, not_measured=missing)
        out.written += [report_dir / "ladder.md", report_dir / "ladder.json"]
    folder.record(out.written)
    return out
