"""The baseline gate of one fidelity case: pass, fail with a readable reason, or record for an update."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.gate.baselines import Baseline, BaselineError, baseline_path


def update_command(candidate: str) -> str:
    """The exact command that (re)writes a candidate's baseline."""
    return f"pytest fidelity_tests -k {candidate} --fidelity-update-baselines"


@dataclass
class Gate:
    """Checks scored cases against ``<baselines>/<candidate>.json``."""

    baselines: Path
    update: bool
    config_path: Path

    def failure(self, scored: Any) -> str | None:
        """The failure message for ``scored`` (a :class:`harness.run.session.ScoredShard`), or None when it passes.

        Under ``--fidelity-update-baselines`` nothing fails here: the controller writes
        the measured values at the end of the run and says which files it wrote.
        """
        if self.update:
            return None
        name, shard = scored.candidate, scored.shard
        path = baseline_path(self.baselines, name)
        if not path.is_file():
            return (
                f"no baseline for candidate {name!r} (expected {path}); "
                f"create it on purpose with: {update_command(name)}"
            )
        try:
            baseline = Baseline.load(path, name)
        except BaselineError as exc:
            return str(exc)
        if not baseline.thresholds(shard):
            return (
                f"{path}: no thresholds for shard {shard:02d} and no default entry; "
                f"add them with: {update_command(name)}"
            )
        violations = baseline.check(shard, scored.headline)
        if not violations:
            return None
        lines = [f"{v.describe()} (candidate {name}, shard {shard:02d})" for v in violations]
        lines.append(f"baseline: {path}")
        lines.append(f"if this change is intended, update with: {update_command(name)}")
        return "\n".join(lines)

    def check(self, scored: Any) -> None:
        """Assert that ``scored`` meets its baseline (pytest-friendly: hides this frame)."""
        __tracebackhide__ = True
        message = self.failure(scored)
        if message is not None:
            raise AssertionError(message)
