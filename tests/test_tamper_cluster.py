"""Tamper campaign, cluster results: a result is re-derived where it is received, never believed.

Real results are made by the cluster task itself (:func:`harness.run.cluster.task.run_case`, run in this
process: no Ray needed) for the tiny project's ``good`` and ``bad`` candidates on shard 0. Each case edits
ONE thing and reseals the result's sha256 (so only the re-derivation can see it); the driver's check must
refuse it naming the field, the expected and the found value. Executor addresses are validated, and an
unreachable head is a named error within the connect timeout instead of a hang in ``ray.init``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.errors import FidelityError
from harness.run.cluster.ray_executor import check_reachable, check_result_identity, parse_executor, verify_result
from harness.run.cluster.task import TaskSpec, result_digest, run_case


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, fidelity_project: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("cluster") / "p"
    shutil.copytree(fidelity_project, root, symlinks=True)
    cfg = root / "fidelity.toml"
    spec = TaskSpec(config=str(cfg), config_sha256=hashlib.sha256(cfg.read_bytes()).hexdigest(), device="cpu", score_from=0,
                    cache_key=b"k" * 32)
    out = {name: run_case(spec, name, 0) for name in ("good", "bad")}
    for r in out.values():
        assert "error" not in r, r
    return cfg, out


def _reseal(res: dict[str, Any], report: dict[str, Any] | None = None, positions: bytes | None = None) -> dict[str, Any]:
    res = dict(res)
    if report is not None:
        res["report"] = json.dumps(report, sort_keys=True)
    if positions is not None:
        res["positions"] = positions
    res["sha256"] = result_digest(res["report"], res["positions"])
    return res


def test_real_results_pass(results: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    _cfg, res = results
    for name in ("good", "bad"):
        out = verify_result(res[name], name, 0)
        assert out.report["candidate"] == name


def _scaled_headline(d: dict[str, Any]) -> None:
    """Headline mean divided by ten, and the totals with it (the rows untouched)."""
    d["metrics"]["kld"]["mean"] /= 10
    d["metrics"]["totals"]["sum_kld"] /= 10


def _scaled_everything(d: dict[str, Any]) -> None:
    """Headline, totals and every row divided by ten: consistent with itself, not with its positions."""
    _scaled_headline(d)
    for r in d["metrics"]["contexts"]:
        r["sum_kld"] /= 10
        r["mean_kld"] /= 10


def _more_top1(d: dict[str, Any]) -> None:
    r = d["metrics"]["contexts"][0]
    r["top1"] = max(r["top1"] - 1, 0)


CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("headline-and-totals-divided-by-ten", _scaled_headline,
     r"metrics\.totals\.sum_kld \(re-derived from its rows\): expected [0-9.e-]+, found [0-9.e-]+"),
    ("self-consistent-report-divided-by-ten", _scaled_everything,
     r"metrics\.contexts\[0\]\.sum_kld \(re-derived from its positions\): expected [0-9.e-]+, found [0-9.e-]+ \(positions of another"),
    ("a-top1-count-edited", _more_top1, r"metrics\.contexts\[0\]\.top1 \(re-derived from its positions\): expected \d+, found \d+"),
]


@pytest.mark.parametrize(("edit", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_edited_report_refused(results: tuple[Path, dict[str, dict[str, Any]]], edit: Callable[[dict[str, Any]], None],
                               pattern: str) -> None:
    _cfg, res = results
    doc = json.loads(res["good"]["report"])
    edit(doc)
    with pytest.raises(FidelityError, match=r"<ray task good shard 00> on .*: " + pattern):
        verify_result(_reseal(res["good"], report=doc), "good", 0)


def test_positions_of_another_candidate_refused(results: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    _cfg, res = results
    forged = _reseal(res["good"], positions=res["bad"]["positions"])
    with pytest.raises(FidelityError, match=r"metrics\.contexts\[0\]\.sum_kld \(re-derived from its positions\): expected "
                                            r"[0-9.e-]+, found [0-9.e-]+ \(positions of another candidate"):
        verify_result(forged, "good", 0)


def test_report_of_another_candidate_renamed_refused_by_identity(results: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    """``bad``'s report and positions relabelled as ``good``'s: consistent with itself; the driver's identity of
    ``good`` (by content) is not the one it carries."""
    from harness.inputs.config import load_config
    from harness.reports.shard import ShardReport
    from harness.run.session import FidelitySession

    cfg, res = results
    doc = json.loads(res["bad"]["report"])
    doc["candidate"] = "good"
    doc["comparability"]["candidate"]["name"] = "good"
    out = verify_result(_reseal(res["bad"], report=doc), "good", 0)  # consistent with its own positions
    session = FidelitySession(config=load_config(cfg), device="cpu")
    report = ShardReport.from_json_dict(out.report)
    with pytest.raises(FidelityError, match=r"<ray task good shard 00>: comparability\.candidate\.identity \(of the task it "
                                            r"was sent\): expected \{.*\}, found \{.*\}"):
        check_result_identity(report, session, "good", 0, 0)
    other = copy.deepcopy(json.loads(res["good"]["report"]))
    other["comparability"]["shard"]["sha256"] = "0" * 64
    with pytest.raises(FidelityError, match=r"comparability\.shard\.sha256 \(of the task it was sent\): expected [0-9a-f]{64}, "
                                            r"found 0{64}"):
        check_result_identity(ShardReport.from_json_dict(other), session, "good", 0, 0)
    with pytest.raises(FidelityError, match=r"comparability\.score_from \(of the task it was sent\): expected 4, found 0"):
        check_result_identity(ShardReport.from_json_dict(json.loads(res["good"]["report"])), session, "good", 0, 4)


@pytest.mark.parametrize(("value", "problem"), [
    ("ray:256.1.1.1:99999", r"port '99999' is not within 1\.\.65535"),
    ("ray:256.1.1.1:6379", r"host '256\.1\.1\.1' is not an IPv4 address"),
    ("ray:10.0.0:6379", r"host '10\.0\.0' is not an IPv4 address"),
    ("ray://-head.example:10001", r"host '-head\.example' is not a host name"),
    ("ray:head:0", r"port '0' is not within"),
])
def test_executor_address_validated(value: str, problem: str) -> None:
    with pytest.raises(FidelityError, match=r"executor: expected ray:HOST:PORT or ray://HOST:PORT with a valid host and a port "
                                            rf"in 1\.\.65535, found .{value}. \({problem}"):
        parse_executor(value)


def test_unreachable_head_is_a_named_error_within_the_timeout() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(FidelityError, match=rf"executor ray:127\.0\.0\.1:{port}: expected a Ray head accepting connections at "
                                            rf"127\.0\.0\.1:{port}, found "):
        check_reachable(f"127.0.0.1:{port}", timeout_s=2.0)
    assert time.monotonic() - t0 < 5.0


def test_ladder_command_refuses_a_bad_address(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from harness.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["ladder", "--executor", "ray:256.1.1.1:99999", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "port '99999' is not within 1..65535" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
