"""``--dist loadgroup`` as pytest-xdist documents it, on pytest versions where xdist's own grouping is lost.

pytest-xdist groups the tests marked ``xdist_group(name)`` by appending ``@name`` to each item's node id on the
worker (``item._nodeid``); the controller's scheduler reads the group from the node ids the workers send when
collection finishes. From pytest 9.2 an item's ``nodeid`` is ``str(item._id)``, so that assignment changes
nothing: every test is then a group of its own, and a candidate's shards (:mod:`harness.plugin.plan`), a docs
page's blocks or the Ray tests are spread over the workers (one at a time no longer holds).

This hook, on a worker of a ``--dist loadgroup`` run only, gives the grouped items their ``@group`` node id while
the collection is announced (what xdist sends the scheduler) and restores them afterwards. Only the scheduler
sees the suffix: reports, ``-k``, junit names and the commands the plugin writes keep the plain node ids. Where
xdist's suffix does take effect (an older pytest), the items already carry it and nothing is changed.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest


def group_suffix(item: pytest.Item) -> str | None:
    """``@<names>`` as pytest-xdist forms it for an item's ``xdist_group`` marks (sorted, joined by ``_``), or None."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "@" + "_".join(sorted(names)) if names else None


def _regrouped(session: pytest.Session) -> list[tuple[pytest.Item, Any]]:
    """Give the grouped items their ``@group`` node id; returns (item, its id before) for each one changed."""
    config = session.config
    # on a worker, xdist keeps ``--dist loadgroup`` as ``loadgroup`` (its ``dist`` is "no" there)
    if not hasattr(config, "workerinput") or not config.getoption("loadgroup", False):
        return []
    changed: list[tuple[pytest.Item, Any]] = []
    for item in session.items:
        suffix = group_suffix(item)
        old = getattr(item, "_id", None)
        parse = getattr(type(old), "parse", None)
        if suffix is None or item.nodeid.endswith(suffix) or parse is None:
            continue
        changed.append((item, old))
        item._id = parse(item.nodeid + suffix)
    return changed


@pytest.hookimpl(wrapper=True)
def pytest_collection_finish(session: pytest.Session) -> Generator[None, object, object]:
    """Worker of ``--dist loadgroup``: the collection is announced with each grouped item's ``@group`` node id."""
    changed = _regrouped(session)
    try:
        return (yield)
    finally:
        for item, old in changed:
            item._id = old
