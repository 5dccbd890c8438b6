"""Collection: a ``fidelity.toml`` as a pytest node whose cases are :mod:`harness.plugin.builtin`'s
functions, and the step that makes pytest visit the file when it was named explicitly."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from harness.plugin import builtin
from harness.plugin.plan import FidelityPlan, collected_paths
from harness.plugin.registry import REPORT_KINDS

#: The plan whose cases a configuration file's node collects (set when the run is configured).
PLAN_KEY = pytest.StashKey[FidelityPlan]()


class ConfigCases(pytest.Module):
    """A ``fidelity.toml`` as a pytest node: its cases are the functions of :mod:`harness.plugin.builtin`,
    parametrized from the file (``fidelity.toml::test_fidelity[int8-shard00]``)."""

    def _getobj(self) -> ModuleType:
        return builtin

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        """The file's cases; a kind with nothing to run (no pair declared or selected) is left out, not skipped."""
        plan = self.config.stash[PLAN_KEY]
        empty = {kind.test: not kind.params(plan) for kind in REPORT_KINDS if kind.test is not None}
        return [node for node in super().collect() if not empty.get(getattr(node, "originalname", ""), False)]

    def funcnamefilter(self, name: str) -> bool:
        return name.startswith("test_")

    def classnamefilter(self, name: str) -> bool:
        return False


def collect_config(config: pytest.Config, path: Path) -> None:
    """Make pytest visit the configuration file (where its cases live) when it was given explicitly.

    ``--fidelity-config PATH`` replaces a project's own ``.toml`` test paths (``testpaths``), and the file
    is added to the paths pytest collects unless one of them already contains it."""
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        config.args[:] = [a for a, p in zip(config.args, collected_paths(config)) if p.suffix != ".toml" or p == path]
    if not any(p == path or p in path.parents for p in collected_paths(config)):
        config.args.append(str(path))

