"""A candidate x shard case's headline numbers in ``--junitxml`` output, without warnings under pytest's defaults.

Reasoning: docs/reports.md §"JUnit XML".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

#: The headline fields recorded per case (attributes of :class:`harness.gate.gate` headlines).
KEYS = ("mean_kld", "ci_low", "ci_high", "p99", "top1")
#: The families whose schema holds per-testcase properties.
PER_CASE_FAMILIES = ("xunit1", "legacy")
#: A case's parameter id, at the end of its node id or before ``@<group>`` (harness.plugin.pytest_plugin).
_CASE = re.compile(r"\[([^\]]+)\](?:@[^\[\]]*)?$")


def junit_family(config: pytest.Config) -> str | None:
    """The run's ``junit_family`` when it writes ``--junitxml``, else None."""
    if not config.getoption("xmlpath", None):
        return None
    return str(config.getini("junit_family"))


def headline_numbers(headline: object) -> list[tuple[str, object]]:
    """``[(fidelity_<key>, value)]`` of a scored case's headline."""
    return [(f"fidelity_{key}", getattr(headline, key)) for key in KEYS]


def record_on_case(config: pytest.Config, item: pytest.Item, numbers: list[tuple[str, object]]) -> None:
    """Per-testcase properties, where the run's family allows them (see docs/reports.md §"JUnit XML")."""
    if junit_family(config) in PER_CASE_FAMILIES:
        item.user_properties.extend(numbers)


def suite_property_recorder(config: pytest.Config) -> Callable[[str, object], None] | None:
    """The junitxml writer's ``add_global_property`` (what ``record_testsuite_property`` calls), or None."""
    for plugin in config.pluginmanager.get_plugins():
        add = getattr(plugin, "add_global_property", None)
        if callable(add):
            return add  # type: ignore[no-any-return]
    return None


def record_on_suite(config: pytest.Config, nodeid: str, numbers: list[tuple[str, object]]) -> None:
    """Controller: testsuite properties named by the case, when the run's family is not a per-case one."""
    family = junit_family(config)
    if family is None or family in PER_CASE_FAMILIES:
        return
    add = suite_property_recorder(config)
    case = _CASE.search(nodeid)
    if add is None or case is None:
        return
    for name, value in numbers:
        add(f"{case.group(1)}:{name}", value)


def record_not_measured(config: pytest.Config, missing: Sequence[Mapping[str, str]]) -> None:
    """Controller: one testsuite property per configured candidate without a report,
    ``<candidate>:not_measured`` = ``"<status>: <reason>"`` (any junit family; nothing without ``--junitxml``)."""
    if junit_family(config) is None:
        return
    add = suite_property_recorder(config)
    if add is None:
        return
    for m in missing:
        add(f"{m['candidate']}:not_measured", f"{m['status']}: {m['reason']}")
