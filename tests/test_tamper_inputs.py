"""Inputs (docs/design.md, section 4): a valid fixture, ONE thing broken, and the harness refuses.

Every case copies a valid base (suite, reference store, candidate store, shared head, built once
per module from the tiny project), breaks one thing, runs ``fidelity replay`` in-process
(``harness.cli.main.main``) or the consuming library call, and asserts

* refusal (a non-zero exit code, or a ``FidelityError``),
* an error text naming the file and the cause (``<file>: <what>: expected X, found Y``),
* that no report file (nor a ``*.tmp`` leftover) is left behind.

``TAMPER_CASES`` at the bottom counts the cases (it is asserted, so the number in docs/refuses.md
stays honest).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save

from harness.cli.main import main
from harness.errors import VerificationError
from harness.io.hashing import sha256_file, tokens_sha256

from .conftest import ctx, manifest, project_with_candidate, save_manifest

N_BOOT = "200"


# ----------------------------------------------------------------------------- the valid base


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, fidelity_project: Path) -> Path:
    """suite/, reference/, cand/ (the ``good`` model captured), lm_head.safetensors + .json."""
    return project_with_candidate(fidelity_project, tmp_path_factory.mktemp("tamper-base"), ("suite", "reference"),
                                  ("lm_head.safetensors", "lm_head.json"))


@pytest.fixture
def fx(tmp_path: Path, base: Path) -> Path:
    """A fresh copy of the valid base to break."""
    shutil.copytree(base, tmp_path / "fx")
    return tmp_path / "fx"


def replay_args(fx: Path, out: Path, *extra: str, head: str = "lm_head.safetensors") -> list[str]:
    return ["replay", "--suite", str(fx / "suite"), "--reference", str(fx / "reference"), "--candidate", str(fx / "cand"),
            "--head", str(fx / head), "--n-boot", N_BOOT, "--out", str(out), *extra]


def assert_refused(fx: Path, capsys: pytest.CaptureFixture[str], *patterns: str, extra: tuple[str, ...] = (),
                   head: str = "lm_head.safetensors", code: int = 1) -> str:
    """Run ``fidelity replay`` on ``fx``; it must exit ``code``, name every pattern, write nothing."""
    out_dir = fx.parent / "out"
    out_dir.mkdir(exist_ok=True)
    rc = main(replay_args(fx, out_dir / "r", *extra, head=head))
    err = capsys.readouterr().err
    assert rc == code, err
    assert err.startswith("fidelity: error: ") and "Traceback" not in err, err
    for pat in patterns:
        assert pat in err, f"{pat!r} not in {err!r}"
    assert list(out_dir.rglob("*")) == [], "a refused replay left files behind"
    assert not list(fx.rglob("*.tmp")) and not list(fx.rglob(".*.tmp"))
    return err


# ----------------------------------------------------------------------------- helpers that break one thing


def reseal_file(store: Path, name: str) -> None:
    """Record a (tampered) file's real sha256 in the manifest, so only deeper checks can catch it."""
    doc = manifest(store)
    doc["files"][name]["sha256"] = sha256_file(store / name)
    save_manifest(store, doc)


def write_ctx(store: Path, index: int, tensor: torch.Tensor, suite_sha: str | None = None) -> None:
    """Write a context file exactly as the capture writer does (metadata included), then reseal."""
    suite_sha = suite_sha or manifest(store)["suite_token_sha256"]
    meta = {"fidelity": json.dumps({"index": index, "suite_token_sha256": suite_sha}, sort_keys=True)}
    (store / ctx(index)).write_bytes(save({"hidden_states": tensor.contiguous()}, metadata=meta))
    reseal_file(store, ctx(index))


def load_ctx(store: Path, index: int) -> torch.Tensor:
    from safetensors.torch import load

    return load((store / ctx(index)).read_bytes())["hidden_states"]


def flip_byte(path: Path, offset: int = -3) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def reseal_suite(suite_dir: Path, tokens: np.ndarray | None = None, edit: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Rewrite a suite consistently (every hash recomputed) after changing tokens or fields."""
    from harness.io.atomic import dumps_json
    from harness.io.hashing import sha256_bytes

    doc = json.loads((suite_dir / "suite.json").read_text())
    if tokens is not None:
        np.save(suite_dir / "tokens.npy", tokens.astype("<u4"), allow_pickle=False)
        doc["suite_token_sha256"] = tokens_sha256(tokens)
        for s in doc["shards"]:
            s["sha256"] = tokens_sha256(tokens[s["start"] : s["stop"]])
    if edit is not None:
        edit(doc)
    body = {k: v for k, v in doc.items() if k != "manifest_sha256"}
    doc["manifest_sha256"] = sha256_bytes(dumps_json(body).encode())
    (suite_dir / "suite.json").write_text(json.dumps(doc, indent=2))


def write_head(path: Path, weight: torch.Tensor) -> None:
    """A head file plus a consistent sidecar (so only the shape/value checks can catch it)."""
    path.write_bytes(save({"weight": weight.contiguous()}))
    side = json.loads(path.with_suffix(".json").read_text()) if path.with_suffix(".json").exists() else {}
    side.update(sha256=sha256_file(path), vocab_size=int(weight.shape[0]), hidden_size=int(weight.shape[-1]))
    path.with_suffix(".json").write_text(json.dumps(side))


def head_weight(fx: Path) -> torch.Tensor:
    from safetensors.torch import load

    return load((fx / "lm_head.safetensors").read_bytes())["weight"]


class _Boom:
    """A pickle payload that would create a marker file if anything ever unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


# ----------------------------------------------------------------------------- the valid base replays


def test_valid_base_replays(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = fx.parent / "ok" / "good.json"
    assert main(replay_args(fx, out, "--shards", "1")) == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["comparability"]["shard"]["index"] == 1 and out.with_suffix(".md").is_file()
    assert main(replay_args(fx, fx.parent / "all", "--shards", "0,2-3", "--window", "4")) == 0
    assert sorted(p.name for p in (fx.parent / "all").iterdir()) == [
        f"shard-{s:02d}.{e}" for s in (0, 2, 3) for e in ("json", "md")
    ]


# ----------------------------------------------------------------------------- capture stores

STORE_CASES: list[tuple[str, Callable[[Path], None], tuple[str, ...]]] = []


def store_case(name: str, *patterns: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
    def deco(fn: Callable[[Path], None]) -> Callable[[Path], None]:
        STORE_CASES.append((name, fn, patterns))
        return fn

    return deco


@store_case("flipped-byte", "cand/ctx-000002.safetensors: sha256: expected")
def _(fx: Path) -> None:
    flip_byte(fx / "cand" / ctx(2))


@store_case("flipped-byte-reference", "reference/ctx-000005.safetensors: sha256: expected")
def _(fx: Path) -> None:
    flip_byte(fx / "reference" / ctx(5), offset=200)


@store_case("truncated", "cand/ctx-000003.safetensors: corrupt or truncated safetensors")
def _(fx: Path) -> None:
    p = fx / "cand" / ctx(3)
    p.write_bytes(p.read_bytes()[:-40])
    reseal_file(fx / "cand", ctx(3))


@store_case("wrong-dtype", "ctx-000001.safetensors: hidden_states dtype: expected torch.bfloat16, found torch.float32")
def _(fx: Path) -> None:
    write_ctx(fx / "cand", 1, load_ctx(fx / "cand", 1).float())


@store_case("wrong-shape", "ctx-000001.safetensors: hidden_states shape: expected [31, 32], found [30, 32]")
def _(fx: Path) -> None:
    write_ctx(fx / "cand", 1, load_ctx(fx / "cand", 1)[:30])


@store_case("nan-row", "ctx-000006.safetensors: hidden_states values: expected all finite, found 32 NaN/Inf")
def _(fx: Path) -> None:
    t = load_ctx(fx / "cand", 6).clone()
    t[4] = float("nan")
    write_ctx(fx / "cand", 6, t)


@store_case("inf-row", "ctx-000000.safetensors: hidden_states values: expected all finite, found 32 NaN/Inf")
def _(fx: Path) -> None:
    t = load_ctx(fx / "reference", 0).clone()
    t[-1] = float("-inf")
    write_ctx(fx / "reference", 0, t)


@store_case("listed-file-missing", "cand/ctx-000004.safetensors: listed context file missing")
def _(fx: Path) -> None:
    (fx / "cand" / ctx(4)).unlink()


@store_case("context-not-captured", "cand/capture.json: contexts of shard(s) 0,1,2,3: expected all captured, found 1 missing (first: 7)")
def _(fx: Path) -> None:
    (fx / "cand" / ctx(7)).unlink()
    doc = manifest(fx / "cand")
    del doc["files"][ctx(7)]
    save_manifest(fx / "cand", doc)


@store_case("duplicate-context-file", "cand/capture.json: duplicate context index 1: expected ctx-000001.safetensors, found ctx-0000001.safetensors")
def _(fx: Path) -> None:
    shutil.copy(fx / "cand" / ctx(1), fx / "cand" / "ctx-0000001.safetensors")
    doc = manifest(fx / "cand")
    doc["files"]["ctx-0000001.safetensors"] = dict(doc["files"][ctx(1)])
    save_manifest(fx / "cand", doc)


@store_case("duplicate-manifest-key", "cand/capture.json: JSON key 'ctx-000001.safetensors': expected each key once, found listed twice")
def _(fx: Path) -> None:
    mf = fx / "cand" / "capture.json"
    entry = json.dumps(manifest(fx / "cand")["files"][ctx(1)])
    mf.write_text(mf.read_text().replace('"files": {', f'"files": {{"{ctx(1)}": {entry},', 1))


@store_case("extra-context-file", "cand/ctx-000099.safetensors: context file not listed in capture.json")
def _(fx: Path) -> None:
    shutil.copy(fx / "cand" / ctx(1), fx / "cand" / ctx(99))


@store_case("dotdot-path", "capture.json: file name '../reference/ctx-000002.safetensors' leaves the store folder")
def _(fx: Path) -> None:
    doc = manifest(fx / "cand")
    doc["files"]["../reference/ctx-000002.safetensors"] = doc["files"].pop(ctx(2))
    save_manifest(fx / "cand", doc)


@store_case("absolute-path", "leaves the store folder: expected a plain ctx-NNNNNN.safetensors name, found /")
def _(fx: Path) -> None:
    doc = manifest(fx / "cand")
    doc["files"][str(fx / "reference" / ctx(2))] = doc["files"].pop(ctx(2))
    save_manifest(fx / "cand", doc)


@store_case("symlink-leaves-store", "cand/ctx-000002.safetensors: symlink leaves the store folder")
def _(fx: Path) -> None:
    outside = fx.parent / "outside.safetensors"
    shutil.copy(fx / "cand" / ctx(2), outside)
    (fx / "cand" / ctx(2)).unlink()
    os.symlink(outside, fx / "cand" / ctx(2))


@store_case("pickle-renamed-safetensors", "cand/ctx-000003.safetensors: corrupt or truncated safetensors")
def _(fx: Path) -> None:
    (fx / "cand" / ctx(3)).write_bytes(pickle.dumps({"hidden_states": _Boom(fx.parent / "PWNED")}))
    reseal_file(fx / "cand", ctx(3))


@store_case("files-swapped", "cand/ctx-000000.safetensors: embedded identity", "expected (0, ", "found (1, ")
def _(fx: Path) -> None:
    s = fx / "cand"
    a, b = (s / ctx(0)).read_bytes(), (s / ctx(1)).read_bytes()
    (s / ctx(0)).write_bytes(b)
    (s / ctx(1)).write_bytes(a)
    reseal_file(s, ctx(0))
    reseal_file(s, ctx(1))


@store_case("file-from-another-suite", "cand/ctx-000005.safetensors: embedded identity")
def _(fx: Path) -> None:
    write_ctx(fx / "cand", 5, load_ctx(fx / "cand", 5), suite_sha="e" * 64)


@store_case("capture-json-suite-mismatch", "cand/capture.json: suite_token_sha256: expected", "found " + "f" * 64)
def _(fx: Path) -> None:
    doc = manifest(fx / "cand")
    doc["suite_token_sha256"] = "f" * 64
    save_manifest(fx / "cand", doc)


@store_case("capture-json-width-mismatch", "cand/capture.json: hidden_size (same as the reference store): expected 32, found 64")
def _(fx: Path) -> None:
    doc = manifest(fx / "cand")
    doc["hidden_size"] = 64
    save_manifest(fx / "cand", doc)


@store_case("capture-json-nan", "cand/capture.json: number: expected finite JSON numbers, found NaN")
def _(fx: Path) -> None:
    mf = fx / "cand" / "capture.json"
    mf.write_text(mf.read_text().replace('"hidden_size": 32', '"hidden_size": NaN'))


@store_case("capture-json-kind", "cand/capture.json: kind: expected hidden_states or logits, found weights")
def _(fx: Path) -> None:
    doc = manifest(fx / "cand")
    doc["kind"] = "weights"
    save_manifest(fx / "cand", doc)


@pytest.mark.parametrize("name,breaker,patterns", STORE_CASES, ids=[c[0] for c in STORE_CASES])
def test_store_tamper(fx: Path, capsys: pytest.CaptureFixture[str], name: str, breaker: Callable[[Path], None], patterns: tuple[str, ...]) -> None:
    breaker(fx)
    assert_refused(fx, capsys, *patterns)
    assert not (fx.parent / "PWNED").exists(), "a pickle was loaded"


# ----------------------------------------------------------------------------- suites

SUITE_CASES: list[tuple[str, Callable[[Path], None], tuple[str, ...]]] = []


def suite_case(name: str, *patterns: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
    def deco(fn: Callable[[Path], None]) -> Callable[[Path], None]:
        SUITE_CASES.append((name, fn, patterns))
        return fn

    return deco


@suite_case("token-id-ge-vocab", "suite/tokens.npy: token id below vocab_size: expected < 300, found 300")
def _(fx: Path) -> None:
    tokens = np.load(fx / "suite" / "tokens.npy")
    tokens[3, 7] = 300
    reseal_suite(fx / "suite", tokens=tokens)


@suite_case("suite-hash-mismatch", "suite/tokens.npy: suite_token_sha256: expected")
def _(fx: Path) -> None:
    tokens = np.load(fx / "suite" / "tokens.npy")
    tokens[0, 0] = (int(tokens[0, 0]) + 1) % 300
    np.save(fx / "suite" / "tokens.npy", tokens, allow_pickle=False)


@suite_case("shard-hash-mismatch", "suite/tokens.npy: shard 2 sha256: expected " + "a" * 64 + ", found")
def _(fx: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["shards"][2]["sha256"] = "a" * 64

    reseal_suite(fx / "suite", edit=edit)


@suite_case("overlapping-shards", "suite/suite.json: shards[1] (overlapping, missing or empty): expected index 1 starting at 2, found index 1 [1, 4)")
def _(fx: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["shards"][1]["start"] = 1

    reseal_suite(fx / "suite", edit=edit)


@suite_case("missing-shard-coverage", "suite/suite.json: shards cover contexts: expected 0-8, found 0-6")
def _(fx: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        del doc["shards"][3]

    reseal_suite(fx / "suite", edit=edit)


@suite_case("suite-json-hand-edit", "suite/suite.json: manifest_sha256 (a field was edited): expected")
def _(fx: Path) -> None:
    doc = json.loads((fx / "suite" / "suite.json").read_text())
    doc["contexts"][0]["stratum"] = "prose"
    (fx / "suite" / "suite.json").write_text(json.dumps(doc))


@suite_case("suite-json-wrong-type", "suite/suite.json: shards[0]: expected {index: int, start: int, stop: int, sha256: str}")
def _(fx: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["shards"][0]["stop"] = "2"

    reseal_suite(fx / "suite", edit=edit)


@suite_case("tokens-pickled-npy", "suite/tokens.npy: not a readable .npy array")
def _(fx: Path) -> None:
    arr = np.empty(1, dtype=object)
    arr[0] = _Boom(fx.parent / "PWNED")
    np.save(fx / "suite" / "tokens.npy", arr, allow_pickle=True)


@suite_case("tokens-wrong-dtype", "suite/tokens.npy: dtype: expected <u4, found <i8")
def _(fx: Path) -> None:
    np.save(fx / "suite" / "tokens.npy", np.load(fx / "suite" / "tokens.npy").astype("<i8"))


@pytest.mark.parametrize("name,breaker,patterns", SUITE_CASES, ids=[c[0] for c in SUITE_CASES])
def test_suite_tamper(fx: Path, capsys: pytest.CaptureFixture[str], name: str, breaker: Callable[[Path], None], patterns: tuple[str, ...]) -> None:
    breaker(fx)
    assert_refused(fx, capsys, *patterns)
    assert not (fx.parent / "PWNED").exists(), "a pickle was loaded"


USAGE_CASES = [
    ("shard-out-of-range", ("--shards", "9"), "shard 9 (from '9') out of range: the suite has 4 shards"),
    ("window-too-large", ("--window", "31"), "suite.json: --window (score_from): expected 0..30 (n_ctx 32), found 31"),
]


@pytest.mark.parametrize("name,extra,pattern", USAGE_CASES, ids=[c[0] for c in USAGE_CASES])
def test_usage_refusals(fx: Path, capsys: pytest.CaptureFixture[str], name: str, extra: tuple[str, ...], pattern: str) -> None:
    assert_refused(fx, capsys, pattern, extra=extra, code=1 if name == "window-too-large" else 2)


def test_json_out_with_several_shards(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = fx.parent / "out" / "x.json"
    assert main(replay_args(fx, out, "--shards", "0-1")) == 2
    assert "x.json: --out names one JSON file but 2 shards are selected" in capsys.readouterr().err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


# ----------------------------------------------------------------------------- heads

HEAD_CASES: list[tuple[str, Callable[[Path], None], tuple[str, ...]]] = []


def head_case(name: str, *patterns: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
    def deco(fn: Callable[[Path], None]) -> Callable[[Path], None]:
        HEAD_CASES.append((name, fn, patterns))
        return fn

    return deco


@head_case("head-hash-mismatch", "lm_head.safetensors: sha256 (vs sidecar lm_head.json): expected")
def _(fx: Path) -> None:
    flip_byte(fx / "lm_head.safetensors")


@head_case("head-smaller-vocab", "lm_head.safetensors: head vocab_size (>= the suite's tokenizer vocab): expected >= 300, found 256")
def _(fx: Path) -> None:
    write_head(fx / "lm_head.safetensors", head_weight(fx)[:256])


@head_case("head-other-hidden", "lm_head.safetensors: head hidden_size (the width of", "expected 32, found 16")
def _(fx: Path) -> None:
    write_head(fx / "lm_head.safetensors", head_weight(fx)[:, :16])


@head_case("head-nan", "lm_head.safetensors: weight values: expected all finite, found 1 NaN/Inf")
def _(fx: Path) -> None:
    w = head_weight(fx).clone()
    w[17, 3] = float("nan")
    write_head(fx / "lm_head.safetensors", w)


@head_case("head-wrong-dtype", "lm_head.safetensors: weight dtype: expected torch.bfloat16, found torch.float16")
def _(fx: Path) -> None:
    write_head(fx / "lm_head.safetensors", head_weight(fx).half())


@head_case("head-sidecar-shape-lie", "lm_head.safetensors: weight vocab_size (vs sidecar lm_head.json): expected 512, found 300")
def _(fx: Path) -> None:
    side = json.loads((fx / "lm_head.json").read_text())
    side["vocab_size"] = 512
    (fx / "lm_head.json").write_text(json.dumps(side))


@head_case("head-pickle-renamed", "lm_head.safetensors: corrupt or truncated safetensors")
def _(fx: Path) -> None:
    (fx / "lm_head.safetensors").write_bytes(pickle.dumps({"weight": _Boom(fx.parent / "PWNED")}))
    (fx / "lm_head.json").unlink()


@pytest.mark.parametrize("name,breaker,patterns", HEAD_CASES, ids=[c[0] for c in HEAD_CASES])
def test_head_tamper(fx: Path, capsys: pytest.CaptureFixture[str], name: str, breaker: Callable[[Path], None], patterns: tuple[str, ...]) -> None:
    breaker(fx)
    assert_refused(fx, capsys, *patterns)
    assert not (fx.parent / "PWNED").exists(), "a pickle was loaded"


def test_candidate_head_other_hidden(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (fx / "own").mkdir()
    write_head(fx / "own" / "lm_head.safetensors", head_weight(fx)[:, :16])
    assert_refused(fx, capsys, "own/lm_head.safetensors: candidate head hidden_size", "expected 32, found 16",
                   extra=("--candidate-head", str(fx / "own" / "lm_head.safetensors")))


# ----------------------------------------------------------------------------- reports and aggregates


@pytest.fixture(scope="module")
def reports(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Valid replayed reports: shards 0 and 1 full, shard 1 windowed."""
    out = tmp_path_factory.mktemp("reports")
    argv = lambda o, *x: ["replay", "--suite", str(base / "suite"), "--reference", str(base / "reference"),  # noqa: E731
                          "--candidate", str(base / "cand"), "--head", str(base / "lm_head.safetensors"),
                          "--n-boot", N_BOOT, "--name", "good", "--out", str(o), *x]
    assert main(argv(out / "full", "--shards", "0-1")) == 0
    assert main(argv(out / "win", "--shards", "1", "--window", "8")) == 0
    return {"s0": out / "full" / "shard-00.json", "s1": out / "full" / "shard-01.json", "s1w": out / "win" / "shard-01.json"}


def _load(p: Path) -> Any:
    from harness.reports.shard import ShardReport

    return ShardReport.load(p)


def _doc(p: Path) -> dict[str, Any]:
    return json.loads(p.read_text())


REPORT_FILE_CASES = [
    ("nan", lambda t: t.replace('"mean": ', '"mean": NaN, "x": ', 1), "number: expected finite JSON numbers, found NaN"),
    ("infinity", lambda t: t.replace('"max": ', '"max": -Infinity, "y": ', 1), "number: expected finite JSON numbers, found -Infinity"),
    ("overflow-1e999", lambda t: t.replace('"mean": ', '"mean": 1e999, "x": ', 1), "number: expected finite JSON numbers, found 1e999 (overflows a float)"),
    ("truncated-half-json", lambda t: t[: len(t) // 2], "JSON: expected valid JSON, found error at line"),
]


@pytest.mark.parametrize("name,edit,pattern", REPORT_FILE_CASES, ids=[c[0] for c in REPORT_FILE_CASES])
def test_report_file_refused(tmp_path: Path, reports: dict[str, Path], name: str, edit: Callable[[str], str], pattern: str) -> None:
    p = tmp_path / "r.json"
    p.write_text(edit(reports["s0"].read_text()))
    with pytest.raises(VerificationError, match="r.json: ") as e:
        _load(p)
    assert pattern in str(e.value)


def test_report_payload_with_nan_refused_by_consumer(tmp_path: Path, reports: dict[str, Path]) -> None:
    """The plugin's controller (LadderCollector) takes worker payloads as dicts: NaN is refused, nothing written."""
    from harness.plugin.ladder import LadderCollector

    doc = _doc(reports["s0"])
    doc["metrics"]["kld"]["p99"] = float("nan")
    col = LadderCollector(report_dir=tmp_path / "rep")
    with pytest.raises(VerificationError, match=r"<pytest worker payload>: number at \$\.metrics\.kld\.p99: expected finite, found nan"):
        col.add(doc, passed=True)
    assert not (tmp_path / "rep").exists()


def _reports(reports: dict[str, Path], *keys: str) -> list[Any]:
    return [_load(reports[k]) for k in keys]


def test_aggregate_accepts_valid(reports: dict[str, Path]) -> None:
    from harness.reports.aggregate import aggregate

    agg = aggregate(_reports(reports, "s0", "s1"))
    assert agg["n_contexts"] == 4 and agg["score_from"] == 0


def _nan_in_memory(rs: list[Any]) -> None:
    rs[1].metrics["kld"]["max"] = float("inf")


def _other_head(rs: list[Any]) -> None:
    rs[1].comparability["head_sha256"] = "0" * 64


def _rows_disagree(rs: list[Any]) -> None:
    rs[1].metrics["contexts"][0]["sum_kld"] *= 2


AGGREGATE_CASES = [
    ("mixing-windows", ("s0", "s1w"), None, "comparability.score_from: expected 0, found 8"),
    ("overlapping-shards", ("s1", "s1"), None, "shard 01: expected each shard once"),
    ("other-head", ("s0", "s1"), _other_head, "comparability.head_sha256: expected"),
    ("rows-disagree-with-summary", ("s0", "s1"), _rows_disagree, "metrics.totals.sum_kld: expected"),
    ("inf-in-memory", ("s0", "s1"), _nan_in_memory, "number at $.metrics.kld.max: expected finite, found inf"),
    ("missing-shards", ("s0", "s1"), "complete", "shards: expected all 4 shards, found missing 02, 03"),
]


@pytest.mark.parametrize("name,keys,edit,pattern", AGGREGATE_CASES, ids=[c[0] for c in AGGREGATE_CASES])
def test_aggregate_refuses(reports: dict[str, Path], name: str, keys: tuple[str, ...], edit: Any, pattern: str) -> None:
    from harness.reports.aggregate import aggregate

    rs = _reports(reports, *keys)
    if callable(edit):
        edit(rs)
    with pytest.raises(VerificationError) as e:
        aggregate(rs, n_shards=4 if edit == "complete" else None)
    assert pattern in str(e.value)


def test_plugin_case_fails_on_tampered_store(pytester: pytest.Pytester, fidelity_project: Path, base: Path) -> None:
    """The pytest twin: a stored candidate with one flipped byte fails its case, and no report is written."""
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("models"))
    shutil.copytree(base / "cand", pytester.path / "cand")
    toml = pytester.path / "fidelity.toml"
    text = toml.read_text().split("[[candidates]]")[0].replace('model = "models/reference"\n', "")
    toml.write_text(text + '[[candidates]]\nname = "stored"\nstore = "cand"\n')
    flip_byte(pytester.path / "cand" / ctx(2))
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "shard01", "--fidelity-update-baselines")
    result.assert_outcomes(errors=1)  # the scoring fixture fails: the case never passes
    result.stdout.fnmatch_lines(["*stored shard 01: *cand/ctx-000002.safetensors: sha256: expected *, found *"])
    assert not list(pytester.path.rglob("shard-*.json")) and not (pytester.path / "baselines").exists()


# ----------------------------------------------------------------------------- the count

TAMPER_CASES = (
    len(STORE_CASES) + len(SUITE_CASES) + len(USAGE_CASES) + 1  # json-out-with-several-shards
    + len(HEAD_CASES) + 1  # candidate head
    + len(REPORT_FILE_CASES) + 1  # payload NaN
    + len(AGGREGATE_CASES) + 1  # plugin case
)


def test_tamper_case_count() -> None:
    """The number quoted in docs/refuses.md."""
    assert TAMPER_CASES == 54, TAMPER_CASES
