"""``--dist loadgroup`` keeps an ``xdist_group``'s tests on one worker (the plugin's ``pytest_collection_finish``);
the node ids that reports, ``-k`` and the plugin's parsers see stay as they are."""

from __future__ import annotations

import re

import pytest

from harness.plugin.junit import _CASE
from harness.plugin.run import _CASE_ID

GROUPED = """
import pytest


@pytest.mark.xdist_group("a")
@pytest.mark.parametrize("i", range(4))
def test_a(i):
    pass


@pytest.mark.xdist_group(name="b")
@pytest.mark.parametrize("i", range(4))
def test_b(i):
    pass


@pytest.mark.parametrize("i", range(4))
def test_free(i):
    pass
"""


@pytest.mark.slow  # a pytest run with two pytest-xdist workers of its own
def test_a_group_runs_on_one_worker_under_its_plain_ids(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_grouped=GROUPED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=12)
    ran = re.findall(r"^\[(gw\d+)\] .*PASSED (\S+)\s*$", result.stdout.str(), re.M)
    assert len(ran) == 12, result.stdout.str()
    assert not [nodeid for _, nodeid in ran if "@" in nodeid]  # the reports' node ids: no group suffix
    workers: dict[str, set[str]] = {}
    for worker, nodeid in ran:
        workers.setdefault(nodeid.split("::")[1].split("[")[0], set()).add(worker)
    assert len(workers["test_a"]) == 1 and len(workers["test_b"]) == 1, result.stdout.str()
    # xdist's own suffix (a pytest before 9.2 keeps it in the node id) does not hide a case from the plugin's parsers
    for nodeid in ("fidelity.toml::test_fidelity[int8-shard03]", "fidelity.toml::test_fidelity[int8-shard03]@int8"):
        case = _CASE_ID.search(nodeid)
        assert case is not None and case.group(1) == "int8", nodeid
        suite = _CASE.search(nodeid)
        assert suite is not None and suite.group(1) == "int8-shard03", nodeid
    assert _CASE_ID.search("fidelity.toml::test_fidelity[int8-shard03]x") is None
