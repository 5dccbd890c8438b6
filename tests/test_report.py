"""Shard report: round trip, atomic files, fail-closed loading, comparability key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.errors import VerificationError
from harness.metrics import ContextLabel, summarize
from harness.metrics.scores import PositionScores
from harness.reports.shard import SCHEMA, ShardReport, make_comparability


@pytest.fixture(scope="module")
def metrics() -> dict:
    rng = np.random.default_rng(0)
    n = 240
    s = PositionScores(
        rng.lognormal(-7, 2, n), rng.random(n) * 0.01, 1 - rng.random(n) * 0.01, rng.random(n), rng.random(n),
        rng.integers(0, 3, n), rng.integers(0, 3, n), rng.lognormal(-7, 2, n), rng.random(n) * 4, rng.random(n),
        rng.random(n), rng.integers(0, 6, n), rng.integers(0, 11, n),
    )
    labels = [ContextLabel(i, f"doc{i // 2}", "code" if i % 2 else "prose") for i in range(8)]
    return summarize(s, np.repeat(np.arange(8), 30), np.tile(np.arange(30), 8), labels, n_boot=200, n_boot_tails=50)


def make_report(metrics: dict, **over) -> ShardReport:
    comp = make_comparability(
        suite_token_sha256="a" * 64,
        shard_index=3,
        shard_sha256="b" * 64,
        score_from=0,
        reference={"name": "bf16", "sha256": "c" * 64},
        candidate={"name": "q4_k", "sha256": "d" * 64},
        head_sha256="e" * 64,
        engine={"engine": "transformers", "version": "4.51", "torch": "2.13.0"},
        scorer={"method": "single-pass-tiled", "gemm_dtype": "bfloat16", "softmax_dtype": "float32"},
    )
    comp.update(over)
    return ShardReport("q4_k", comp, metrics, timing={"wall_s": 1.25})


def test_write_and_load_round_trip(tmp_path: Path, metrics: dict) -> None:
    r = make_report(metrics)
    j, md = r.write(tmp_path)
    assert j.name == "q4_k.shard003.json" and md.name == "q4_k.shard003.md"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left
    r2 = ShardReport.load(j)
    assert r2 == r
    assert r2.to_json_dict() == json.loads(j.read_text())
    text = md.read_text()
    for needle in ("mean KLD", "95% interval", "CVaR1%", "Histogram", "Per stratum", "Worst contexts", "head_sha256"):
        assert needle in text


def test_write_to_explicit_json_path(tmp_path: Path, metrics: dict) -> None:
    j, md = make_report(metrics).write(tmp_path / "sub" / "x.json")
    assert j.exists() and md == tmp_path / "sub" / "x.md" and md.exists()


def test_equality_ignores_timing_and_created(metrics: dict) -> None:
    a = make_report(metrics)
    b = make_report(metrics)
    b.timing = {"wall_s": 99.0}
    b.created = "2000-01-01T00:00:00+00:00"
    assert a == b


def test_comparable_key(metrics: dict) -> None:
    a = make_report(metrics)
    other_shard = make_report(metrics, shard={"index": 4, "sha256": "f" * 64})
    assert a.comparable_key() == other_shard.comparable_key()
    assert a.comparable_key() != make_report(metrics, score_from=256).comparable_key()
    assert a.comparable_key() != make_report(metrics, head_sha256="0" * 64).comparable_key()
    assert a.comparable_key() != make_report(metrics, engine={"engine": "llama.cpp"}).comparable_key()
    hash(a.comparable_key())


def test_load_rejects_nan(tmp_path: Path, metrics: dict) -> None:
    j, _ = make_report(metrics).write(tmp_path)
    j.write_text(j.read_text().replace('"wall_s": 1.25', '"wall_s": NaN'))
    with pytest.raises(VerificationError, match="NaN") as e:
        ShardReport.load(j)
    assert str(j) in str(e.value)


def test_write_refuses_nan(tmp_path: Path, metrics: dict) -> None:
    r = make_report(metrics)
    r.timing = {"wall_s": float("nan")}
    with pytest.raises(ValueError, match="non-finite"):
        r.write(tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "mutate,what",
    [
        (lambda d: d.update(schema="fidelity.shard-report/0"), "schema"),
        (lambda d: d.pop("metrics"), "'metrics'"),
        (lambda d: d["comparability"].pop("head_sha256"), "comparability.head_sha256"),
        (lambda d: d["metrics"].pop("kld"), "metrics.kld"),
        (lambda d: d["comparability"].update(score_from=5), "metrics.score_from"),
    ],
)
def test_from_json_dict_names_file_and_key(metrics: dict, mutate, what: str) -> None:
    d = json.loads(json.dumps(make_report(metrics).to_json_dict()))
    mutate(d)
    with pytest.raises(VerificationError) as e:
        ShardReport.from_json_dict(d, "reports/q4_k.json")
    assert "reports/q4_k.json" in str(e.value) and what in str(e.value)


def test_load_rejects_corrupt_and_missing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": ')
    with pytest.raises(VerificationError, match="bad.json: JSON"):
        ShardReport.load(bad)
    with pytest.raises(VerificationError, match="missing"):
        ShardReport.load(tmp_path / "nope.json")


def test_schema_constant() -> None:
    assert SCHEMA == "fidelity.shard-report/1"


@pytest.mark.parametrize("key, expected", [
    (("bootstrap", "seed"), "present"),  # a nested record's required key
    (("kld", "p99"), "present"),
    (("ppl", "ratio"), "present"),
])
def test_a_report_is_checked_recursively_when_read(tmp_path: Path, metrics: dict, key: tuple[str, ...],
                                                   expected: str) -> None:
    """Every nested record of ``metrics`` (metrics/records.py) is checked from its own TypedDict when the
    report is read: a missing key deep inside is refused by name, never a KeyError in a consumer."""
    json_path, _ = make_report(metrics).write(tmp_path)
    doc = json.loads(json_path.read_text())
    del doc["metrics"][key[0]][key[1]]
    json_path.write_text(json.dumps(doc))
    with pytest.raises(VerificationError) as e:
        ShardReport.load(json_path)
    assert e.value.what == f"metrics.{key[0]}.{key[1]}" and e.value.expected == expected


def test_a_nested_value_of_another_type_is_refused(tmp_path: Path, metrics: dict) -> None:
    json_path, _ = make_report(metrics).write(tmp_path)
    doc = json.loads(json_path.read_text())
    doc["metrics"]["worst_contexts"][0]["stratum"] = 7  # a ContextRow's string
    json_path.write_text(json.dumps(doc))
    with pytest.raises(VerificationError) as e:
        ShardReport.load(json_path)
    assert e.value.what == "metrics.worst_contexts[0].stratum" and e.value.expected == "a string"
