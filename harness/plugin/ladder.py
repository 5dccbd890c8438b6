"""The ladder: per-shard reports collected during a run, their artifacts, and the summary table.

Only the controller process owns a :class:`LadderCollector`; under pytest-xdist the
workers' reports arrive through the pytest reports and are written here, so a
parallel run writes exactly what a serial one does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.gate.baselines import (
    Headline,
    headline_of,
    identity_sha256,
    load_baseline_or_none,
    unused_baselines,
    write_baseline,
)
from harness.interchange.suite_manifest import load_any_suite
from harness.reports.aggregate import (
    FloorRecord,
    LadderRow,
    NotMeasured,
    annotate_floor,
    format_ladder,
    ladder_notes,
    ladder_rows,
    matching_floor,
    write_ladder,
)
from harness.reports.shard import ShardReport, ShardReportJSON, report_shard

if TYPE_CHECKING:
    from harness.inputs.config import FidelityConfig


@dataclass
class LadderCollector:
    """Collects shard reports (JSON dicts), writes each as it arrives, summarises at the end."""

    report_dir: Path
    reports: list[ShardReportJSON] = field(default_factory=list)
    #: ``reports`` as checked reports, in the same order (each payload parsed and checked once, by :meth:`add`).
    parsed: list[ShardReport] = field(default_factory=list)
    verdicts: dict[tuple[str, int], bool] = field(default_factory=dict)
    #: ``(candidate, shard)`` cases that failed only because the candidate has no baseline file.
    no_baseline: set[tuple[str, int]] = field(default_factory=set)
    written_baselines: list[Path] = field(default_factory=list)
    unused_baselines: list[Path] = field(default_factory=list)
    ladder_rows: list[LadderRow] = field(default_factory=list)
    #: The shard report files written (the report folder's ledger lists them).
    written: list[Path] = field(default_factory=list)
    #: Candidates of this run that are one model by content (reported, never silently gated twice).
    same_identity: list[list[str]] = field(default_factory=list)
    #: Baselines of this run's candidates that record no identity (named at the end of the run).
    without_identity: list[Path] = field(default_factory=list)
    #: The reference's precision floor shown beside the ladder (``precision_floor.json`` of this suite and
    #: reference), or None.
    floor: FloorRecord | None = None

    def add(self, payload: object, *, passed: bool, no_baseline: bool = False) -> None:
        """Record one case's report and write ``<report-dir>/<candidate>/shard-<NN>.json`` and ``.md``."""
        report = ShardReport.from_json_dict(payload, path="<pytest worker payload>")
        shard = report_shard(report)
        self.written += report.write(self.report_dir / report.candidate / f"shard-{shard:02d}.json")
        self.reports.append(report.to_json_dict())
        self.parsed.append(report)
        self.verdicts[(report.candidate, shard)] = passed
        if no_baseline:
            self.no_baseline.add((report.candidate, shard))

    def finish(self, *, update_baselines: bool, config: FidelityConfig, not_scored: dict[str, str] | None = None) -> None:
        """Write the ladder artifacts; on update, the baseline files; find unused baselines.

        ``not_scored``: candidate -> why it has no report (``"failed: ..."`` / ``"skipped: ..."``); every one
        of them that is configured and has no report is listed in ``ladder.md`` / ``ladder.json``
        (``not_measured``)."""
        reports = list(self.parsed)  # each checked once, as it arrived (add)

        # every report is checked against the run's suite, which the ladder's aggregates record
        self.ladder_rows = ladder_rows(reports, self.verdicts, suite=load_any_suite(config.suite, verify=False),
                                       no_baseline=self.no_baseline)
        scored = {r.candidate for r in reports}
        why = not_scored or {}
        missing: list[NotMeasured] = [{"candidate": c.name, "status": why[c.name].split(":", 1)[0], "reason": why[c.name].split(":", 1)[1].strip()}
                   for c in config.candidates if c.name not in scored and c.name in why]
        self.floor = matching_floor(self.report_dir / "precision_floor.json",
                                    self.ladder_rows[0]["aggregate"]["comparability"] if self.ladder_rows else None)
        annotate_floor(self.ladder_rows, self.floor)
        write_ladder(self.report_dir, self.ladder_rows, self.floor, missing)
        identities = {r.candidate: r.comparability["candidate"].get("identity") for r in reports}
        # one model through two engines is two measurements; one model twice through one engine is reported
        engines = {r.candidate: r.comparability["engine"].get("candidate") for r in reports}
        self.same_identity = same_identity_groups({n: {"model": i, "engine": engines.get(n)}
                                                   for n, i in identities.items() if isinstance(i, dict)})
        if update_baselines:
            by_cand: dict[str, dict[int, Headline]] = {}
            for r in reports:
                by_cand.setdefault(r.candidate, {})[report_shard(r)] = headline_of(r.metrics)
            for name, measured in sorted(by_cand.items()):
                ident = identities.get(name)
                self.written_baselines.append(write_baseline(config.baselines, name, measured,
                                                             ident if isinstance(ident, dict) else None))
        self.unused_baselines = unused_baselines(config.baselines, [c.name for c in config.candidates])
        if not update_baselines:
            self.without_identity = sorted(b.path for b in (load_baseline_or_none(config.baselines, n)
                                                            for n in sorted(identities)) if b is not None and b.identity is None)

    def summary_lines(self) -> list[str]:
        """The ladder as terminal lines, sorted by mean KLD, plus baseline notes."""
        lines = [*format_ladder(self.ladder_rows), *ladder_notes(self.floor)]
        lines.append(f"reports: {self.report_dir}/")
        for p in self.written_baselines:
            lines.append(f"baseline written: {p}")
        for p in self.unused_baselines:
            lines.append(f"unused baseline (no such candidate in the config): {p}")
        for p in self.without_identity:
            lines.append(f"baseline without identity (measured before identities were recorded; the gate cannot tell "
                         f"another model under this name): {p}; re-derive it on purpose with --fidelity-update-baselines")
        for group in self.same_identity:
            lines.append(f"same identity: {', '.join(group)} are one model by content (config and weight files "
                         "by sha256) through one engine: measured twice")
        return lines


def same_identity_groups(identities: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """Candidates (names, sorted) that share one identity (``{"model": content identity, "engine": ...}``):
    groups of two or more."""
    by: dict[str, list[str]] = {}
    for name, ident in sorted(identities.items()):
        model = ident["model"]
        fields = {k: v for k, v in model.items() if k != "name"} if isinstance(model, Mapping) else model
        key = identity_sha256({"model": fields, "engine": ident.get("engine")})
        by.setdefault(key, []).append(name)
    return sorted(g for g in by.values() if len(g) > 1)
