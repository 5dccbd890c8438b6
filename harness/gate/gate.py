"""The baseline gate of one fidelity case: pass, fail with a readable reason, or record for an update."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.gate.baselines import Baseline, BaselineError, baseline_path


def update_command(candidate: str, selector: tuple[str, ...] = ("fidelity.toml",)) -> str:
    """The exact command that (re)writes one candidate's baseline.

    ``selector``: the words that select the run's configuration (the ``fidelity.toml`` pytest is
    pointed at, plus ``--fidelity-config PATH`` when one was given); the candidate is selected by
    exact name (``-k`` would match every candidate whose name contains it)."""
    return " ".join(["pytest", *selector, "--fidelity-candidates", candidate, "--fidelity-update-baselines"])


def no_baselines_yet(baselines: Path, selector: tuple[str, ...] = ("fidelity.toml",)) -> str:
    """The one line a first run prints instead of one failure per case (see :meth:`Gate.fresh`)."""
    return (f"no baselines yet: run {' '.join(['pytest', *selector, '--fidelity-update-baselines'])} to record this "
            f"ladder as the baselines in {baselines}/ (then commit them); until then no case is gated")


@dataclass
class Gate:
    """Checks scored cases against ``<baselines>/<candidate>.json``."""

    baselines: Path
    update: bool
    config_path: Path
    #: Command-line words selecting the configuration in fix-it hints (see :func:`update_command`).
    selector: tuple[str, ...] = ("fidelity.toml",)

    def fresh(self) -> bool:
        """A first run: the baselines folder holds no baseline file at all (none recorded yet, for any candidate).
        Its cases are scored and reported but not gated, and the run says once how to record the baselines;
        a candidate without a baseline beside others that have one still fails (:meth:`failure`)."""
        return not self.update and not (self.baselines.is_dir() and any(self.baselines.glob("*.json")))

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
                f"create it on purpose with: {update_command(name, self.selector)}"
            )
        try:
            baseline = Baseline.load(path, name)
        except BaselineError as exc:
            return str(exc)
        identity = scored.report.comparability.get("candidate", {}).get("identity")
        problem = baseline.identity_problem(identity if isinstance(identity, dict) else {})
        if problem:
            return f"{problem}\nif the candidate changed on purpose, update with: {update_command(name, self.selector)}"
        if not baseline.thresholds(shard):
            return (
                f"{path}: no thresholds for shard {shard:02d} and no default entry; "
                f"add them with: {update_command(name, self.selector)}"
            )
        violations = baseline.check(shard, scored.headline)
        if not violations:
            return None
        lines = [f"{v.describe()} (candidate {name}, shard {shard:02d})" for v in violations]
        lines.append(f"baseline: {path}")
        lines.append(f"if this change is intended, update with: {update_command(name, self.selector)}")
        return "\n".join(lines)
