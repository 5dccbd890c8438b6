"""Aggregation (harness.reports.aggregate, ``fidelity aggregate``): every fail-closed rule with a crafted bad
report, grouping of several candidates, and the two-machine equivalence through pytester."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.cli.main import main
from harness.errors import VerificationError
from harness.reports.aggregate import aggregate
from harness.reports.shard import ShardReport

pytestmark = pytest.mark.slow  # its fixture runs the tiny project through pytester (captures and scoring)


@pytest.fixture(scope="module")
def shard_reports(tmp_path_factory: pytest.TempPathFactory, fidelity_project: Path) -> dict[str, list[dict[str, Any]]]:
    """JSON dicts of every shard report of both candidates of the tiny project (scored in-process)."""
    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession

    root = tmp_path_factory.mktemp("agg") / "project"
    shutil.copytree(fidelity_project, root)
    session = FidelitySession(config=load_config(root / "fidelity.toml"))
    session.plan([(c, s) for c in ("good", "bad") for s in range(4)])
    out: dict[str, Any] = {c: [session.score(session.config.candidate(c), s).report.to_json_dict() for s in range(4)] for c in ("good", "bad")}
    # the raw per-position KLD of every shard (scorer output, before any summary): the independent check
    pos = [session.positions(session.config.candidate("good"), s) for s in range(4)]
    out["raw_kld_good"] = [np.asarray(p.scores.kld, dtype=np.float64) for p in pos]
    # the source cluster of every position (from the suite's labels of its context)
    out["raw_cluster_good"] = [[{lab.index: str(lab.source_cluster) for lab in p.labels}[int(i)] for i in p.context_index]
                               for p in pos]
    return out


def _reports(docs: list[dict[str, Any]]) -> list[ShardReport]:
    return [ShardReport.from_json_dict(copy.deepcopy(d)) for d in docs]


def test_complete_aggregate_matches_the_shards(shard_reports: dict[str, list[dict[str, Any]]], reference_interval: Any) -> None:
    reps = _reports(shard_reports["good"])
    agg = aggregate(reps, n_shards=4)
    assert agg["n_positions"] == sum(r.metrics["n_positions"] for r in reps) == 8 * 31
    # checked against the scorer's raw per-position values in float64, not against the reports' own totals
    raw = np.concatenate(shard_reports["raw_kld_good"])
    assert raw.size == agg["n_positions"]
    assert agg["kld"]["mean"] == pytest.approx(float(np.mean(raw, dtype=np.float64)), rel=1e-12)
    assert agg["kld"]["max"] == float(raw.max())
    # the interval against the independent float64 implementation (tests/conftest.py) over the raw positions,
    # with the aggregate's own draws (clusters in sorted-name order, its n_boot and seed)
    from harness.metrics.bootstrap import draw_cluster_weights

    names = sorted({c for part in shard_reports["raw_cluster_good"] for c in part})
    cluster = np.array([names.index(c) for part in shard_reports["raw_cluster_good"] for c in part])
    W = draw_cluster_weights(len(names), agg["bootstrap"]["n_boot"], agg["bootstrap"]["seed"])
    want = reference_interval(raw, cluster, W, right_skewed=True)  # the KLD: a right-skewed mean
    assert agg["kld"]["ci95"] == pytest.approx([max(want[0], 0.0), want[1]], rel=1e-9)
    assert agg["exceedance"] == {t: int(np.count_nonzero(raw > float(t))) for t in agg["exceedance"]}
    for name, (blo, bhi) in agg["kld"]["quantile_bounds"].items():  # numpy's own quantile inside each bracket
        q = float(name[1:]) / 100
        assert blo <= float(np.quantile(raw, q)) <= bhi, name


def _bad(shard_reports: dict[str, list[dict[str, Any]]], edit: Any, cand: str = "good") -> list[ShardReport]:
    docs = copy.deepcopy(shard_reports[cand])
    edit(docs)
    return _reports(docs)


def _set_window(docs: list[dict[str, Any]]) -> None:
    docs[2]["comparability"]["score_from"] = 8
    docs[2]["metrics"]["score_from"] = 8


def _set_head(docs: list[dict[str, Any]]) -> None:
    docs[1]["comparability"]["head_sha256"] = "0" * 64


def _set_identity(docs: list[dict[str, Any]]) -> None:
    docs[3]["comparability"]["candidate"]["identity"] = {"name": "other"}


def _dup_shard(docs: list[dict[str, Any]]) -> None:
    docs[1] = copy.deepcopy(docs[0])


def _overlap_context(docs: list[dict[str, Any]]) -> None:
    docs[1]["comparability"]["shard"]["index"] = 3
    docs[3] = copy.deepcopy(docs[0])  # shard 00's contexts again under another shard number
    docs[3]["comparability"]["shard"]["index"] = 2
    del docs[2]


def _rows_disagree(docs: list[dict[str, Any]]) -> None:
    docs[2]["metrics"]["contexts"][0]["sum_kld"] *= 1.5


def _rows_positions(docs: list[dict[str, Any]]) -> None:
    row = docs[0]["metrics"]["contexts"][0]
    row["positions"] -= 1
    row["top1"] = min(row["top1"], row["positions"])  # within its positions: only the reconciliation can see it


def _hist_spec(docs: list[dict[str, Any]]) -> None:
    docs[1]["metrics"]["histogram"]["spec"]["bins_per_decade"] = 20


def _no_bootstrap(docs: list[dict[str, Any]]) -> None:
    del docs[1]["metrics"]["bootstrap"]


def _schema(docs: list[dict[str, Any]]) -> None:
    docs[1]["comparability"]["protocol_version"] = 99


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set_window, "comparability.score_from: expected 0, found 8"),
        (_set_head, "comparability.head_sha256"),
        (_set_identity, "comparability.candidate.identity"),
        (_schema, "comparability.protocol_version: expected 1, found 99"),
        (_dup_shard, "shard 00: expected each shard once"),
        (_overlap_context, "context 0: expected each context in one report"),
        (_rows_disagree, "metrics.totals.sum_kld: expected"),
        (_rows_positions, "against the per-context rows"),
        (_hist_spec, "histogram spec"),
        (_no_bootstrap, "required key 'metrics.bootstrap': expected present, found missing"),
    ],
    ids=["window", "head", "identity", "protocol", "duplicate-shard", "overlapping-contexts", "rows-kld",
         "rows-positions", "histogram-spec", "no-bootstrap"],
)
def test_fail_closed(shard_reports: dict[str, list[dict[str, Any]]], edit: Any, message: str) -> None:
    with pytest.raises(VerificationError, match=message.replace("(", r"\(").replace(".", r"\.")):
        aggregate(_bad(shard_reports, edit))


def test_missing_shards_when_complete(shard_reports: dict[str, list[dict[str, Any]]]) -> None:
    reps = _reports(shard_reports["good"])
    aggregate([reps[0], reps[2]])  # a partial aggregate is fine when completeness is not asked
    with pytest.raises(VerificationError, match="shards: expected all 4 shards, found missing 01, 03"):
        aggregate([reps[0], reps[2]], n_shards=4)


def test_two_candidates_in_one_aggregate_are_refused(shard_reports: dict[str, list[dict[str, Any]]]) -> None:
    with pytest.raises(VerificationError, match="one candidate per aggregate"):
        aggregate(_reports(shard_reports["good"][:2] + shard_reports["bad"][2:]))


def _write(dir_: Path, docs: list[dict[str, Any]]) -> None:
    for d in docs:
        r = ShardReport.from_json_dict(copy.deepcopy(d))
        r.write(dir_ / r.candidate / f"shard-{r.comparability['shard']['index']:02d}.json")


def test_cli_groups_candidates_and_fails_closed(tmp_path: Path, shard_reports: dict[str, list[dict[str, Any]]],
                                                 capsys: pytest.CaptureFixture[str], fidelity_project: Path) -> None:
    suite = ["--suite", str(fidelity_project / "suite")]
    _write(tmp_path / "m1", shard_reports["good"][:2] + shard_reports["bad"][:2])
    _write(tmp_path / "m2", shard_reports["good"][2:] + shard_reports["bad"][2:])
    assert main(["aggregate", str(tmp_path / "m1"), str(tmp_path / "m2"), *suite, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "| good" in out and "| bad" in out
    for c in ("good", "bad"):
        agg = json.loads((tmp_path / "out" / c / "aggregate.json").read_text())
        assert agg["candidate"] == c and [s["index"] for s in agg["shards"]] == [0, 1, 2, 3]
    assert (tmp_path / "out" / "ladder.md").is_file()
    # a window-mixed report on machine 2: exit 1 naming the file and the field
    bad = copy.deepcopy(shard_reports["good"][3])
    bad["comparability"]["score_from"] = bad["metrics"]["score_from"] = 16
    (tmp_path / "m2" / "good" / "shard-03.json").write_text(json.dumps(bad))
    assert main(["aggregate", str(tmp_path / "m1"), str(tmp_path / "m2"), *suite, "--out", str(tmp_path / "out2")]) == 1
    err = capsys.readouterr().err
    assert "m2/good/shard-03.json: comparability.score_from: expected 0, found 16" in err
    # missing shards (every shard of the suite is required unless --partial)
    assert main(["aggregate", str(tmp_path / "m1"), *suite, "--out", str(tmp_path / "out3")]) == 1
    assert "missing 02, 03" in capsys.readouterr().err


@pytest.mark.slow  # three runs of the tiny project through pytester
def test_two_machines_equal_one_full_run(pytester: pytest.Pytester, fidelity_project: Path) -> None:
    """Shards 0,1 on machine A and 2,3 on machine B aggregate to exactly the single full run."""
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    opts = ["-p", "no:cacheprovider", "--fidelity-update-baselines", "-m", "fidelity"]
    pytester.runpytest(*opts, "--fidelity-shards", "0,1", "--fidelity-report-dir", "A").assert_outcomes(passed=4)
    pytester.runpytest(*opts, "--fidelity-shards", "2,3", "--fidelity-report-dir", "B").assert_outcomes(passed=4)
    pytester.runpytest(*opts, "--fidelity-report-dir", "full").assert_outcomes(passed=8)
    p = pytester.path
    assert main(["aggregate", str(p / "A"), str(p / "B"), "--suite", str(p / "suite"), "--out", str(p / "AB")]) == 0
    assert main(["aggregate", str(p / "full"), "--suite", str(p / "suite"), "--out", str(p / "one")]) == 0
    for c in ("good", "bad"):
        assert (p / "AB" / c / "aggregate.json").read_text() == (p / "one" / c / "aggregate.json").read_text()
    assert (p / "AB" / "ladder.json").read_text() == (p / "one" / "ladder.json").read_text()
    assert (p / "AB" / "ladder.md").read_text() == (p / "one" / "ladder.md").read_text()
