"""Hostile input: every parser of a file the harness reads gives a valid object or a
``FidelityError`` with a message — never another exception type.

Targets: ``fidelity.toml`` (``load_config``), baseline files (``Baseline.load``), shard reports
(``ShardReport.from_json_dict`` / ``load``), capture manifests (``CaptureStore.open`` +
``verify_all``) and ``suite.json`` (``Suite.load``, with the manifest hash recomputed so the fuzz
reaches past it). Inputs are random text and, more usefully, valid documents with a few random
mutations (a value replaced by random JSON, or a key deleted).
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import FidelityError

pytestmark = pytest.mark.slow  # hypothesis fuzzing of every parser (hundreds of examples each)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4), max_leaves=12)


def clean(fn: Callable[[], Any]) -> Any:
    """Run ``fn``; a ``FidelityError`` must carry a message, any other exception fails the test."""
    try:
        return fn()
    except FidelityError as e:
        assert str(e).strip(), "a FidelityError without a message"
        return None


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):  # a few rows are enough; long arrays would swamp the draw
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def mutated(draw: st.DrawFn, valid: Any, extra_keys: tuple[str, ...] = ()) -> Any:
    """``valid`` with 1-3 random mutations: replace a value, delete a key, or add a key."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            return draw(json_values)
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(json_values)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(extra_keys) if extra_keys else st.text(max_size=8))] = draw(json_values)
    return doc


# ----------------------------------------------------------------------------- fidelity.toml


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if v is None:
        return '""'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def dump_toml(doc: dict[str, Any]) -> str:
    """A dict as TOML, every value inline (tables become inline tables)."""
    return "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in doc.items())


VALID_CONFIG = {
    "suite": {"path": "suite"},
    "reference": {"name": "bf16", "model": "models/reference", "store": "reference", "head": "lm_head.safetensors"},
    "settings": {"cache_dir": ".cache", "baselines": "baselines", "n_boot": 500},
    "candidates": [{"name": "good", "model": "models/good", "tags": ["a"], "size_bytes": 10},
                   {"name": "stored", "store": "cand", "engine": "transformers", "head": "h.safetensors"}],
    "pairs": [{"a": "good", "b": "stored", "margin": 0.001}],
}
CONFIG_KEYS = ("suite", "reference", "settings", "candidates", "pairs", "name", "model", "store", "head", "path",
               "n_boot", "tags", "size_bytes", "engine", "a", "b", "margin", "cache_dir", "baselines")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "models" / "good").mkdir(parents=True)  # a live candidate's folder must exist at config load,
    (root / "models" / "good" / "config.json").write_text("{}")  # and hold config.json (a Hugging Face folder);
    (root / "cand").mkdir()  # a replayed candidate's store must hold capture.json
    (root / "cand" / "capture.json").write_text("{}")
    return root


def test_config_valid_document_loads(scratch: Path) -> None:
    from harness.inputs.config import load_config

    (scratch / "fidelity.toml").write_text(dump_toml(VALID_CONFIG))
    cfg = load_config(scratch / "fidelity.toml")
    assert [c.name for c in cfg.candidates] == ["good", "stored"] and cfg.n_boot == 500


@FUZZ
@given(doc=mutated(VALID_CONFIG, CONFIG_KEYS))
def test_config_mutated(scratch: Path, doc: Any) -> None:
    from harness.inputs.config import load_config

    p = scratch / "fidelity.toml"
    p.write_text(dump_toml(doc) if isinstance(doc, dict) else _toml_value(doc), "utf-8")
    clean(lambda: load_config(p))


@FUZZ
@given(text=st.text(max_size=200) | st.sampled_from(["[suite]\npath = 1\n", "candidates = 3\n", "[[pairs]]\na = 'x'\n"]))
def test_config_text(scratch: Path, text: str) -> None:
    from harness.inputs.config import load_config

    p = scratch / "fidelity.toml"
    p.write_text(text, "utf-8", errors="surrogatepass")
    clean(lambda: load_config(p))


@FUZZ
@given(data=st.binary(max_size=80))
def test_config_bytes(scratch: Path, data: bytes) -> None:
    from harness.inputs.config import load_config

    p = scratch / "fidelity.toml"
    p.write_bytes(data)
    clean(lambda: load_config(p))


# ----------------------------------------------------------------------------- baselines

VALID_BASELINE = {
    "schema": "fidelity.baseline/1",
    "candidate": "good",
    "margin": {"relative": 0.1},
    "default": {"max_mean_kld": 0.005},
    "shards": {"00": {"max_ci_high": 0.0051, "max_mean_kld": 0.0046, "max_p99": 0.031, "min_top1": 0.93}},
}


@FUZZ
@given(doc=mutated(VALID_BASELINE, ("max_mean_kld", "min_top1", "01", "default", "shards")))
def test_baseline_mutated(scratch: Path, doc: Any) -> None:
    from harness.gate.baselines import Baseline, Headline

    p = scratch / "good.json"
    p.write_text(json.dumps(doc))
    b = clean(lambda: Baseline.load(p, "good"))
    if b is not None:  # a loaded baseline can always be checked
        b.check(0, Headline(0.001, 0.0, 0.002, 0.01, 0.99))


@FUZZ
@given(data=st.binary(max_size=80) | st.sampled_from([b'{"a": 1e999}', b'{"schema": NaN}', b"[" * 5000, b"\xff\xfe{}"]))
def test_baseline_bytes(scratch: Path, data: bytes) -> None:
    from harness.gate.baselines import Baseline

    p = scratch / "good.json"
    p.write_bytes(data)
    clean(lambda: Baseline.load(p, "good"))


def test_baseline_infinite_and_huge_thresholds_refused(scratch: Path) -> None:
    from harness.gate.baselines import Baseline, BaselineError

    for raw in ('{"schema": "fidelity.baseline/1", "candidate": "good", "default": {"max_mean_kld": 1e999}}',
                '{"schema": "fidelity.baseline/1", "candidate": "good", "default": {"max_p99": 1' + "0" * 400 + "}}"):
        (scratch / "good.json").write_text(raw)
        with pytest.raises(BaselineError, match="finite"):
            Baseline.load(scratch / "good.json", "good")


# ----------------------------------------------------------------------------- shard reports


@pytest.fixture(scope="module")
def valid_report() -> dict[str, Any]:
    from harness.metrics import ContextLabel, summarize
    from harness.metrics.scores import PositionScores
    from harness.reports.shard import ShardReport, make_comparability

    rng = np.random.default_rng(0)
    n = 60
    s = PositionScores(rng.lognormal(-7, 2, n), rng.random(n) * 0.01, 1 - rng.random(n) * 0.01, rng.random(n),
                       rng.random(n), rng.integers(0, 3, n), rng.integers(0, 3, n), rng.lognormal(-7, 2, n),
                       rng.random(n) * 3, rng.random(n), rng.random(n), rng.integers(0, 6, n), rng.integers(0, 11, n))
    labels = [ContextLabel(i, f"doc{i // 2}", "code" if i % 2 else "prose") for i in range(4)]
    m = summarize(s, np.repeat(np.arange(4), 15), np.tile(np.arange(15), 4), labels, n_boot=100, n_boot_tails=20)
    comp = make_comparability(suite_token_sha256="a" * 64, shard_index=1, shard_sha256="b" * 64, score_from=0,
                              reference={"name": "bf16"}, candidate={"name": "q4"}, head_sha256="e" * 64,
                              engine={"name": "transformers"}, scorer={"method": "single-pass-tiled"})
    return ShardReport("q4", comp, m, timing={"s": 1.0}).to_json_dict()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_report_mutated(valid_report: dict[str, Any], data: st.DataObject) -> None:
    from harness.reports.shard import ShardReport

    doc = data.draw(mutated(valid_report, ("schema", "candidate", "metrics", "comparability", "score_from", "shard")))
    r = clean(lambda: ShardReport.from_json_dict(doc, "fuzz.json"))
    if r is not None:
        assert r.stem.startswith(r.candidate)
        clean(lambda: r.comparable_key())


@FUZZ
@given(data=st.binary(max_size=120) | st.sampled_from([b"[" * 5000, b'{"schema": Infinity}', b"\x00\xff"]))
def test_report_bytes(scratch: Path, data: bytes) -> None:
    from harness.reports.shard import ShardReport

    p = scratch / "r.json"
    p.write_bytes(data)
    clean(lambda: ShardReport.load(p))


# ----------------------------------------------------------------------------- capture manifests


@pytest.fixture(scope="module")
def store_fx(tmp_path_factory: pytest.TempPathFactory, tiny_suite: Path) -> tuple[Any, Path, dict[str, Any]]:
    import torch

    from harness.capture.store import StoreWriter
    from harness.engines.identity import runtime_identity
    from harness.inputs.suite import Suite

    suite = Suite.load(tiny_suite)
    root = tmp_path_factory.mktemp("fuzz-store") / "s"
    g = torch.Generator().manual_seed(0)
    with StoreWriter(root, suite, "hidden_states", 8, "bfloat16", {"name": "m"}, {"name": "e", "version": "1"}, runtime_identity(), "cpu") as w:
        for i in range(suite.n_contexts):
            w.write(i, torch.randn(suite.n_ctx - 1, 8, generator=g).to(torch.bfloat16))
    return suite, root, json.loads((root / "capture.json").read_text())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_capture_manifest_mutated(store_fx: tuple[Any, Path, dict[str, Any]], data: st.DataObject) -> None:
    from harness.capture.store import CaptureStore

    suite, root, valid = store_fx
    extra = ("ctx-000000.safetensors", "ctx-000009.safetensors", "../x", "/abs", "index", "sha256", "files", "kind", "dtype")
    doc = data.draw(mutated(valid, extra))
    (root / "capture.json").write_text(json.dumps(doc))
    store = clean(lambda: CaptureStore.open(root, suite))
    if store is not None:
        clean(store.verify_all)


@FUZZ
@given(data=st.binary(max_size=80) | st.sampled_from([b"[" * 5000, b'{"files": {"a": 1, "a": 2}}']))
def test_capture_manifest_bytes(store_fx: tuple[Any, Path, dict[str, Any]], data: bytes) -> None:
    from harness.capture.store import CaptureStore

    suite, root, _valid = store_fx
    (root / "capture.json").write_bytes(data)
    clean(lambda: CaptureStore.open(root, suite))


# ----------------------------------------------------------------------------- suite.json


@pytest.fixture(scope="module")
def suite_fx(tmp_path_factory: pytest.TempPathFactory, tiny_suite: Path) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("fuzz-suite") / "s"
    shutil.copytree(tiny_suite, root)
    return root, json.loads((root / "suite.json").read_text())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), reseal=st.booleans())
def test_suite_json_mutated(suite_fx: tuple[Path, dict[str, Any]], data: st.DataObject, reseal: bool) -> None:
    from harness.inputs.suite import Suite, manifest_sha256

    root, valid = suite_fx
    doc = data.draw(mutated(valid, ("n_ctx", "tokenizer", "contexts", "shards", "protocol_version", "index", "start", "stop")))
    if reseal and isinstance(doc, dict):
        doc["manifest_sha256"] = manifest_sha256(doc)
    (root / "suite.json").write_text(json.dumps(doc))
    s = clean(lambda: Suite.load(root, verify=True))
    if s is not None:
        for k in range(s.n_shards):
            s.shard_indices(k)
    clean(lambda: Suite.load(root, verify=False))


@FUZZ
@given(data=st.binary(max_size=80) | st.sampled_from([b"[" * 5000, b'{"schema": "fidelity.suite/1", "n_ctx": NaN}']))
def test_suite_json_bytes(suite_fx: tuple[Path, dict[str, Any]], data: bytes) -> None:
    from harness.inputs.suite import Suite

    root, _valid = suite_fx
    (root / "suite.json").write_bytes(data)
    clean(lambda: Suite.load(root, verify=True))
