"""The joins between inputs: the trust chain (docs/design.md, section 4).

Each case starts from a valid base, breaks ONE thing a hostile or careless user could break, and
checks the refusal (exit code or exception), the message (file, expected, found) and that nothing
was written. Classes: identity at every join, reconciliation before trusting (aggregate, publish,
verify), sane gates (strict JSON, baselines, pairs), writes that cannot half-happen. The edge cases
that must *run* (a lossless candidate, a 100-shard suite) are at the end.

``TRUST_CASES`` counts the refusal cases (asserted, so the count docs/refuses.md cites stays honest).
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save

from harness.cli.main import main
from harness.errors import VerificationError
from harness.io.hashing import sha256_file

from .conftest import ctx, manifest, project_with_candidate, save_manifest

N_BOOT = "200"


# ----------------------------------------------------------------------------- the valid base


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, fidelity_project: Path) -> Path:
    """suite/, reference/, cand/ (``good`` captured), the shared head, the models, fidelity.toml."""
    return project_with_candidate(fidelity_project, tmp_path_factory.mktemp("trust-base"), ("suite", "reference", "models"),
                                  ("lm_head.safetensors", "lm_head.json", "fidelity.toml"))


@pytest.fixture
def fx(tmp_path: Path, base: Path) -> Path:
    shutil.copytree(base, tmp_path / "fx", symlinks=True)
    return tmp_path / "fx"


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, base: Path) -> dict[str, Path]:
    """Replayed reports of ``cand`` (all shards) with a baseline, and their published set."""
    root = tmp_path_factory.mktemp("trust-pub")
    reports = root / "reports" / "good"
    assert main(replay_args(base, reports, "--name", "good")) == 0
    from harness.gate.baselines import headline_of, write_baseline
    from harness.reports.shard import ShardReport

    heads = {}
    for k in range(4):
        m = ShardReport.load(reports / f"shard-{k:02d}.json").metrics
        heads[k] = headline_of(m)  # a tiny suite: the interval may be not estimable
    write_baseline(root / "baselines", "good", heads)
    out = root / "pub"
    assert main(["publish", "--reports", str(root / "reports"), "--suite", str(base / "suite"), "--baselines",
                 str(root / "baselines"), "--out", str(out)]) == 0
    return {"root": root, "reports": root / "reports", "baselines": root / "baselines", "pub": out}


def replay_args(fx: Path, out: Path, *extra: str, ref: str = "reference", cand: str = "cand",
                head: str = "lm_head.safetensors") -> list[str]:
    return ["replay", "--suite", str(fx / "suite"), "--reference", str(fx / ref), "--candidate", str(fx / cand),
            "--head", str(fx / head), "--n-boot", N_BOOT, "--out", str(out), *extra]


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *patterns: str, code: int = 1,
            untouched: Path | None = None, absent: Path | None = None) -> str:
    """``fidelity argv`` exits ``code``, prints one named error with every pattern, writes nothing."""
    before = snapshot(untouched) if untouched is not None else None
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == code, err
    assert err.startswith("fidelity: error: ") and "Traceback" not in err, err
    for pat in patterns:
        assert pat in err, f"{pat!r} not in {err!r}"
    if untouched is not None:
        assert snapshot(untouched) == before, "a refused command changed its folder"
        assert not list(untouched.rglob("*.tmp")) and not list(untouched.rglob("*.staging"))
    if absent is not None:
        assert not absent.exists(), f"{absent} was written by a refused command"
    return err


def write_ctx(store: Path, index: int, tensor: torch.Tensor) -> None:
    """Write a context file as the capture writer does (metadata included) and reseal its sha256."""
    doc = manifest(store)
    meta = {"fidelity": json.dumps({"index": index, "suite_token_sha256": doc["suite_token_sha256"]}, sort_keys=True)}
    (store / ctx(index)).write_bytes(save({doc["kind"]: tensor.contiguous()}, metadata=meta))
    doc["files"][ctx(index)]["sha256"] = sha256_file(store / ctx(index))
    save_manifest(store, doc)


def lossless_copy(fx: Path, name: str = "lossless") -> Path:
    """A candidate store holding exactly the reference's values, recorded as another model
    (say, a format that happens to be lossless on this model): KLD exactly 0 everywhere."""
    shutil.copytree(fx / "reference", fx / name)
    doc = manifest(fx / name)
    doc["model"] = {**doc["model"], "name": name, "weights": {"model.safetensors": "f" * 64}, "quantization": {"format": "lossless"}}
    save_manifest(fx / name, doc)
    return fx / name


# ============================================================================= 1. identity at every join


def test_reference_store_swapped_for_a_candidate_refused_against_the_reference_model(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, replay_args(fx, fx / "out", "--reference-model", str(fx / "models" / "reference"), ref="cand", cand="cand"),
            "cand/capture.json: model (the configured reference model", "expected {name 'reference'", "found {name 'good'",
            absent=fx / "out", untouched=fx / "cand")


def test_reference_store_swapped_for_a_candidate_refused_against_the_head(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, replay_args(fx, fx / "out", ref="cand", cand="reference"),
            "cand/capture.json: model (the source model of the head", "expected {name 'reference'", "found {name 'good'",
            absent=fx / "out")


def test_reference_model_flag_naming_another_model_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, replay_args(fx, fx / "out", "--reference-model", str(fx / "models" / "bad")),
            "reference/capture.json: model (the configured reference model", "expected {name 'bad'", absent=fx / "out")


def test_candidate_equal_to_the_reference_is_a_self_check(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, replay_args(fx, fx / "out", cand="reference"),
            "reference/capture.json: candidate model: expected a model other than the reference",
            "self-check (KLD 0 by construction)", absent=fx / "out")


def test_candidate_copy_of_the_reference_under_another_name_is_a_self_check(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(fx / "reference", fx / "renamed")
    doc = manifest(fx / "renamed")
    doc["model"]["name"] = "definitely-a-quantized-model"
    save_manifest(fx / "renamed", doc)
    refused(capsys, replay_args(fx, fx / "out", cand="renamed"),
            "renamed/capture.json: candidate model: expected a model other than the reference", absent=fx / "out")


def test_head_sidecar_of_another_model_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.engines.identity import model_identity

    side = json.loads((fx / "lm_head.json").read_text())
    side["source_model"] = model_identity(fx / "models" / "bad")
    (fx / "lm_head.json").write_text(json.dumps(side))
    refused(capsys, replay_args(fx, fx / "out"), "reference/capture.json: model (the source model of the head",
            "expected {name 'bad'", "found {name 'reference'", absent=fx / "out")


def test_shared_head_without_its_sidecar_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (fx / "lm_head.json").unlink()
    refused(capsys, replay_args(fx, fx / "out"), "lm_head.json: source_model (the model the shared head was exported from)",
            "found none (sidecar missing or without source_model)", absent=fx / "out")


def test_reference_manifest_model_edited_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = manifest(fx / "reference")
    doc["model"]["weights"] = {"model.safetensors": "0" * 64}
    save_manifest(fx / "reference", doc)
    refused(capsys, replay_args(fx, fx / "out"), "reference/capture.json: model (the source model of the head",
            "weights model.safetensors:000000000000", absent=fx / "out")


def test_candidate_head_with_another_vocabulary_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.inputs.head import load_head

    w = load_head(fx / "lm_head.safetensors").weight
    wide = torch.cat([w, w[:8]], dim=0).contiguous()
    (fx / "own.safetensors").write_bytes(save({"weight": wide}))
    err = refused(capsys, replay_args(fx, fx / "out", "--candidate-head", str(fx / "own.safetensors")),
                  "own.safetensors: candidate head vocab_size (the shared head", absent=fx / "out")
    assert f"expected {w.shape[0]}, found {w.shape[0] + 8}" in err


def test_logits_candidate_of_another_vocabulary_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A logits-only candidate (say, llama.cpp) whose vocabulary is not the shared head's."""
    from harness.capture.store import StoreWriter
    from harness.engines.identity import runtime_identity
    from harness.inputs.head import load_head
    from harness.inputs.suite import Suite

    suite = Suite.load(fx / "suite")
    vocab = load_head(fx / "lm_head.safetensors").vocab_size + 8
    with StoreWriter(fx / "logits", suite, "logits", vocab, "float32", {"name": "gguf", "sha256": "d" * 64},
                     {"name": "llamacpp", "version": "test"}, runtime_identity(), "cpu") as w:
        for i in range(suite.n_contexts):
            w.write(i, torch.zeros(suite.n_ctx - 1, vocab))
    err = refused(capsys, replay_args(fx, fx / "out", cand="logits"), "logits/capture.json: vocab_size (the shared head", absent=fx / "out")
    assert f"expected {vocab - 8}, found {vocab}" in err


def test_huge_finite_hidden_value_refused_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load

    w = _tiny_world(tmp_path, 4)
    t = load((w["cand"] / ctx(2)).read_bytes())["hidden_states"].clone()
    t[1] = 3.0e38  # finite bf16, but its fp32 logits overflow
    assert bool(torch.isfinite(t).all())
    write_ctx(w["cand"], 2, t)
    refused(capsys, ["replay", "--suite", str(w["suite"]), "--reference", str(w["reference"]), "--candidate", str(w["cand"]),
                     "--head", str(w["head"]), "--n-boot", "100", "--out", str(tmp_path / "out")],
            f"cand/{ctx(2)}: values of context 2, row 1: expected values whose fp32 logits are finite", absent=tmp_path / "out")


def test_imported_kld_reference_scored_from_row_0_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kld", "export", "--suite", str(fx / "suite"), "--reference", str(fx / "reference"),
                 "--head", str(fx / "lm_head.safetensors"), "--out", str(fx / "ref.kld")]) == 0
    assert main(["kld", "import", str(fx / "ref.kld"), "--out", str(fx / "imp"), "--shards", "2"]) == 0
    lossless = fx / "imp" / "cand"
    shutil.copytree(fx / "imp" / "reference", lossless)
    doc = manifest(lossless)
    doc["model"] = {"name": "same-logits", "sha256": "e" * 64, "format": "test copy", "scored_from_row": doc["model"]["scored_from_row"]}
    save_manifest(lossless, doc)
    capsys.readouterr()
    argv = ["replay", "--suite", str(fx / "imp" / "suite"), "--reference", str(fx / "imp" / "reference"), "--candidate", str(lossless),
            "--head", str(fx / "lm_head.safetensors"), "--n-boot", N_BOOT]
    refused(capsys, argv + ["--window", "0", "--out", str(fx / "out")], "imp/reference/capture.json: --window (score_from) of a store holding rows 16..30 only",
            "expected >= 16, found 0", absent=fx / "out")
    # the window the file holds is accepted, and the identical logits give KLD exactly 0 (a lossless run)
    assert main(argv + ["--window", "16", "--out", str(fx / "out")]) == 0
    rep = json.loads((fx / "out" / "shard-00.json").read_text())
    assert rep["metrics"]["kld"]["mean"] == 0.0 and rep["metrics"]["top1"]["agreement"] == 1.0


def _session(fx: Path, edit: str) -> Any:
    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession

    toml = fx / "fidelity.toml"
    text = toml.read_text()
    toml.write_text(eval(edit, {"text": text}))
    return FidelitySession(config=load_config(toml))


def test_pytest_run_refuses_a_reference_store_of_another_model(pytester: pytest.Pytester, fidelity_project: Path) -> None:
    """Through the plugin: every case fails with the named error, and no shard report is written."""
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    doc = manifest(pytester.path / "reference")
    doc["model"]["config_sha256"] = "9" * 64
    save_manifest(pytester.path / "reference", doc)
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "good and shard00", "--fidelity-report-dir", "out")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) == 0 and outcomes.get("failed", 0) + outcomes.get("errors", 0) + outcomes.get("error", 0) == 1
    result.stdout.fnmatch_lines(["*reference/capture.json: model (the configured reference model*found*config 999999999999*"])
    assert not list((pytester.path / "out").rglob("shard-*.json"))


def test_session_refuses_a_swapped_reference_store(fx: Path) -> None:
    s = _session(fx, 'text.replace(\'store = "reference"\', \'store = "cand"\')')
    with pytest.raises(VerificationError, match=r"cand/capture.json: model \(the configured reference model .*models/reference\)"):
        s.score(s.config.candidate("good"), 0)


def test_session_refuses_a_head_of_another_width_before_scoring(fx: Path) -> None:
    from harness.inputs.head import load_head

    w = load_head(fx / "lm_head.safetensors").weight
    (fx / "narrow.safetensors").write_bytes(save({"weight": w[:, :16].contiguous()}))
    side = json.loads((fx / "lm_head.json").read_text())  # a consistent sidecar: only the width is wrong
    side.update(sha256=sha256_file(fx / "narrow.safetensors"), hidden_size=16)
    (fx / "narrow.json").write_text(json.dumps(side))
    s = _session(fx, 'text.replace(\'head = "lm_head.safetensors"\', \'head = "narrow.safetensors"\')')
    with pytest.raises(VerificationError, match=r"narrow.safetensors: head hidden_size .*: expected 32, found 16"):
        s.score(s.config.candidate("good"), 0)


def test_session_refuses_a_candidate_that_is_the_reference(fx: Path) -> None:
    s = _session(fx, 'text.replace(\'model = "models/good"\', \'store = "reference"\')')
    with pytest.raises(VerificationError, match="candidate model: expected a model other than the reference"):
        s.score(s.config.candidate("good"), 0)


def test_session_refuses_a_candidate_of_another_width(fx: Path) -> None:
    doc = manifest(fx / "cand")
    doc["hidden_size"] = 64
    save_manifest(fx / "cand", doc)
    s = _session(fx, 'text.replace(\'model = "models/good"\', \'store = "cand"\')')
    with pytest.raises(VerificationError, match=r"cand/capture.json: hidden_size \(same as the reference store\): expected 32, found 64"):
        s.score(s.config.candidate("good"), 0)


# ============================================================================= 2. reconcile before trusting


def _reports(published: dict[str, Path]) -> list[Any]:
    from harness.reports.shard import ShardReport

    return [ShardReport.load(published["reports"] / "good" / f"shard-{k:02d}.json") for k in range(4)]


def _suite(base: Path) -> Any:
    from harness.inputs.suite import Suite

    return Suite.load(base / "suite")


def _edit_totals_kld(rs: list[Any]) -> None:
    rs[1].metrics["totals"]["sum_kld"] *= 3


def _edit_totals_positions(rs: list[Any]) -> None:
    rs[2].metrics["totals"]["n_positions"] += 31


def _edit_totals_top1(rs: list[Any]) -> None:
    rs[0].metrics["totals"]["top1_count"] -= 1


def _edit_mean(rs: list[Any]) -> None:
    rs[3].metrics["kld"]["mean"] /= 2


def _swap_indices(rs: list[Any]) -> None:
    a, b = rs[0].comparability["shard"], rs[1].comparability["shard"]
    a["index"], b["index"] = b["index"], a["index"]


def _extra_shard(rs: list[Any]) -> None:
    extra = copy.deepcopy(rs[3])
    extra.comparability["shard"]["index"] = 7
    for row in extra.metrics["contexts"]:
        row["index"] += 100
    rs.append(extra)


def _other_suite(rs: list[Any]) -> None:
    for r in rs:
        r.comparability["suite_token_sha256"] = "a" * 64


def _shifted_contexts(rs: list[Any]) -> None:
    for row in rs[3].metrics["contexts"]:
        row["index"] += 1


RECONCILE = [
    ("totals-kld-vs-rows", _edit_totals_kld, "good shard 01: metrics.totals.sum_kld: expected"),
    ("totals-positions-vs-rows", _edit_totals_positions, "metrics.totals.n_positions (against the per-context rows): expected 62, found 93"),
    ("totals-top1-vs-rows", _edit_totals_top1, "metrics.totals.top1_count (against the per-context rows)"),
    ("mean-vs-totals", _edit_mean, "good shard 03: metrics.kld.mean: expected"),
    ("swapped-shard-indices", _swap_indices, "comparability.shard.sha256 of shard 01: expected"),
    ("shard-beyond-the-suite", _extra_shard, "comparability.shard.index: expected 0..3"),
    ("report-of-another-suite", _other_suite, "comparability.suite_token_sha256: expected"),
    ("contexts-not-of-the-shard", _shifted_contexts, "contexts of shard 03: expected 6..7, found extra [8], missing [6]"),
]


@pytest.mark.parametrize("name,edit,pattern", RECONCILE, ids=[c[0] for c in RECONCILE])
def test_aggregate_reconciles_every_report(published: dict[str, Path], base: Path, name: str, edit: Any, pattern: str) -> None:
    from harness.reports.aggregate import aggregate

    rs = _reports(published)
    for r in rs:
        r.source = f"good shard {r.comparability['shard']['index']:02d}"  # type: ignore[attr-defined]
    edit(rs)
    with pytest.raises(VerificationError) as e:
        aggregate(rs, suite=_suite(base))
    assert pattern in str(e.value), str(e.value)


def test_aggregate_cli_requires_the_suite(published: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["aggregate", str(published["reports"]), "--out", str(tmp_path / "agg")])
    assert e.value.code == 2 and "--suite" in capsys.readouterr().err
    assert not (tmp_path / "agg").exists()


def test_publish_requires_the_suite(published: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, ["publish", "--reports", str(published["reports"]), "--out", str(tmp_path / "p")],
            "publish needs the suite the reports belong to", code=2, absent=tmp_path / "p")


def test_publish_refuses_reports_of_another_suite(published: dict[str, Path], fidelity_project: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from harness.inputs.suite import Suite
    from harness.llamacpp.kld_tools import suite_from_tokens

    s = Suite.load(fidelity_project / "suite")
    suite_from_tokens(s.tokens[:, ::-1].copy(), s.vocab_size, tmp_path / "other", n_shards=4)
    refused(capsys, ["publish", "--reports", str(published["reports"]), "--suite", str(tmp_path / "other"), "--out", str(tmp_path / "p")],
            "good/shard-00.json: comparability.suite_token_sha256: expected", absent=tmp_path / "p")


def test_publish_recomputes_verdicts_and_never_copies_them(published: dict[str, Path], base: Path, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    shutil.copytree(published["reports"], reports)
    (reports / "ladder.json").write_text(json.dumps({"schema": "fidelity.ladder/1", "rows": [
        {"candidate": "good", "shards": [0, 1, 2, 3], "verdict": "pass"}]}))
    strict = tmp_path / "baselines"
    strict.mkdir()
    doc = json.loads((published["baselines"] / "good.json").read_text())
    doc["shards"]["02"]["max_mean_kld"] = 1e-9  # shard 02 now fails its baseline
    (strict / "good.json").write_text(json.dumps(doc))
    assert main(["publish", "--reports", str(reports), "--suite", str(base / "suite"), "--baselines", str(strict),
                 "--out", str(tmp_path / "p")]) == 0
    assert "FAIL (1/4)" in (tmp_path / "p" / "ladder.md").read_text()
    assert json.loads((tmp_path / "p" / "results.json").read_text())["candidates"]["good"]["verdict"] == "FAIL (1/4)"


def _reseal(pub: Path) -> None:
    from harness.reports.report_set import write_checksums

    write_checksums(pub)


def _pub_copy(published: dict[str, Path], tmp_path: Path) -> Path:
    shutil.copytree(published["pub"], tmp_path / "pub")
    return tmp_path / "pub"


def test_verify_rederives_a_resealed_verdict(published: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pub = _pub_copy(published, tmp_path)
    text = (pub / "ladder.md").read_text()
    assert "| pass" in text
    (pub / "ladder.md").write_text(text.replace("| pass    ", "| FAIL (0)"))
    _reseal(pub)
    refused(capsys, ["verify", str(pub)], "ladder.md:5: expected", "(re-derived from the shard reports), found", untouched=pub)


def test_verify_rederives_a_resealed_mean(published: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pub = _pub_copy(published, tmp_path)
    res = json.loads((pub / "results.json").read_text())
    res["candidates"]["good"]["aggregate"]["kld"]["mean"] *= 0.5
    (pub / "results.json").write_text(json.dumps(res))
    _reseal(pub)
    refused(capsys, ["verify", str(pub)], "results.json: $.candidates.good.aggregate.kld.mean: expected", untouched=pub)


def test_verify_refuses_a_resealed_shard_report_that_disagrees_with_itself(published: dict[str, Path], tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    pub = _pub_copy(published, tmp_path)
    res = json.loads((pub / "results.json").read_text())
    res["candidates"]["good"]["shards"][1]["metrics"]["totals"]["sum_kld"] *= 0.5
    (pub / "results.json").write_text(json.dumps(res))
    _reseal(pub)
    refused(capsys, ["verify", str(pub)], "candidates.good.shards[1]: metrics.kld.mean (re-derived from metrics.totals): expected",
            untouched=pub)


def test_verify_rederives_a_resealed_plot_point(published: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pub = _pub_copy(published, tmp_path)
    pts = json.loads((pub / "kld-vs-size.json").read_text())
    pts["points"][0]["mean_kld"] = 1e-9
    (pub / "kld-vs-size.json").write_text(json.dumps(pts))
    _reseal(pub)
    refused(capsys, ["verify", str(pub)], "kld-vs-size.json: $.points[0].mean_kld: expected", untouched=pub)


def test_verify_rederives_a_resealed_candidate_page(published: dict[str, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pub = _pub_copy(published, tmp_path)
    page = pub / "good" / "report.md"
    text = page.read_text()
    head, _sep, rest = text.partition("**Mean KLD ")
    page.write_text(head + "**Mean KLD 1.000e-09" + rest[rest.index(" nats**"):])
    _reseal(pub)
    refused(capsys, ["verify", str(pub)], "good/report.md:3: expected '**Mean KLD", "found '**Mean KLD 1.000e-09 nats**", untouched=pub)


def test_verify_refuses_a_resealed_baseline_that_flips_the_verdict(published: dict[str, Path], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pub = _pub_copy(published, tmp_path)
    res = json.loads((pub / "results.json").read_text())
    res["baselines"]["good"]["shards"]["00"]["max_mean_kld"] = 1e-9
    (pub / "results.json").write_text(json.dumps(res))
    _reseal(pub)
    refused(capsys, ["verify", str(pub)], "results.json: $.candidates.good.verdict: expected 'FAIL (1/4)'", untouched=pub)


# ============================================================================= 3. sane gates


def _baseline(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "good.json"
    p.write_text('{"schema": "fidelity.baseline/1", "candidate": "good", ' + body + "}")
    return p


BASELINES = [
    ("min-top1-negative", '"default": {"min_top1": -1}', "default.min_top1: expected a number in [0, 1], found -1"),
    ("min-top1-above-one", '"default": {"min_top1": 1.5}', "default.min_top1: expected a number in [0, 1], found 1.5"),
    ("max-p99-huge", '"shards": {"00": {"max_p99": 1e300}}', "shards.00.max_p99: expected a number in [0, 100], found 1e+300"),
    ("max-mean-negative", '"default": {"max_mean_kld": -0.001}', "default.max_mean_kld: expected a number in [0, 100], found -0.001"),
    ("shard-listed-twice", '"shards": {"00": {"max_p99": 0.1}, "00": {"max_p99": 9}}', "JSON key '00': expected each key once"),
    ("threshold-listed-twice", '"default": {"max_p99": 0.1, "max_p99": 50}', "JSON key 'max_p99': expected each key once"),
    ("shard-key-one-digit", '"shards": {"3": {"max_p99": 0.1}}', "shard key: expected a shard number of at least two digits"),
    ("threshold-a-string", '"default": {"max_ci_high": "0.1"}', "default.max_ci_high: expected a finite number, found '0.1'"),
]


@pytest.mark.parametrize("name,body,pattern", BASELINES, ids=[c[0] for c in BASELINES])
def test_baseline_refused(tmp_path: Path, name: str, body: str, pattern: str) -> None:
    from harness.gate.baselines import Baseline, BaselineError

    p = _baseline(tmp_path, body)
    with pytest.raises(BaselineError) as e:
        Baseline.load(p, "good")
    assert str(e.value).startswith(str(p)) and pattern in str(e.value), str(e.value)


def test_baseline_for_shard_100_round_trips(tmp_path: Path) -> None:
    from harness.gate.baselines import Baseline, Headline, write_baseline

    h = Headline(0.01, 0.009, 0.011, 0.05, 0.9)
    p = write_baseline(tmp_path, "good", {100: h, 7: h})
    b = Baseline.load(p, "good")
    assert sorted(b.shards) == ["07", "100"] and b.thresholds(100)["max_mean_kld"] == pytest.approx(0.01 * 1.1 + 1e-6)
    assert b.check(100, Headline(0.5, 0.4, 0.6, 0.9, 0.5))  # and it gates


PAIRS = [
    ("pair-a-equals-b", 'a = "good"\nb = "good"\nmargin = 0.001', "pairs[0]: expected two different candidates, found a = b = 'good'"),
    ("pair-margin-zero", 'a = "good"\nb = "bad"\nmargin = 0.0', "pairs[0].margin: expected a finite number > 0 (nats), a percentage of the better candidate\'s mean KLD (\"20%\") or a multiple of the precision floor (\"2x floor\"), found 0.0"),
    ("pair-margin-inf", 'a = "good"\nb = "bad"\nmargin = inf', "pairs[0].margin: expected a finite number > 0 (nats), a percentage of the better candidate\'s mean KLD (\"20%\") or a multiple of the precision floor (\"2x floor\"), found inf"),
    ("pair-margin-missing", 'a = "good"\nb = "bad"', "pairs[0].margin: expected a finite number > 0 (nats), a percentage of the better candidate\'s mean KLD (\"20%\") or a multiple of the precision floor (\"2x floor\"), found nothing"),
]


@pytest.mark.parametrize("name,body,pattern", PAIRS, ids=[c[0] for c in PAIRS])
def test_pair_refused(fx: Path, name: str, body: str, pattern: str) -> None:
    from harness.inputs.config import ConfigError, load_config

    toml = fx / "fidelity.toml"
    text = toml.read_text()
    head, _sep, _pairs = text.partition("[[pairs]]")
    toml.write_text(head + "[[pairs]]\n" + body + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(toml)
    assert str(toml) in str(e.value) and pattern in str(e.value), str(e.value)


def test_suite_json_with_a_key_twice_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sj = fx / "suite" / "suite.json"
    sj.write_text(sj.read_text().replace('"n_ctx":', '"n_ctx": 16, "n_ctx":', 1))
    refused(capsys, replay_args(fx, fx / "out"), "suite/suite.json: JSON key 'n_ctx': expected each key once, found listed twice",
            absent=fx / "out")


def test_head_sidecar_with_a_key_twice_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    side = fx / "lm_head.json"
    side.write_text(side.read_text().replace('"sha256":', '"sha256": "0", "sha256":', 1))
    refused(capsys, replay_args(fx, fx / "out"), "lm_head.json: JSON key 'sha256': expected each key once", absent=fx / "out")


def test_head_sidecar_with_nan_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    side = fx / "lm_head.json"
    side.write_text(side.read_text().replace('"hidden_size":', '"x": NaN, "hidden_size":', 1))
    refused(capsys, replay_args(fx, fx / "out"), "lm_head.json: number: expected finite JSON numbers, found NaN", absent=fx / "out")


def test_shard_report_with_a_key_twice_refused(published: dict[str, Path], tmp_path: Path, base: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    shutil.copytree(published["reports"], reports)
    p = reports / "good" / "shard-01.json"
    p.write_text(p.read_text().replace('"candidate": "good"', '"candidate": "bad", "candidate": "good"', 1))
    refused(capsys, ["aggregate", str(reports), "--suite", str(base / "suite"), "--out", str(tmp_path / "agg")],
            "good/shard-01.json: JSON key 'candidate': expected each key once", absent=tmp_path / "agg")


def test_quantization_json_with_a_wrong_type_refused(fx: Path) -> None:
    from harness.inputs.config import CandidateConfig
    from harness.run.session import candidate_size_bytes

    q = fx / "models" / "good" / "quantization.json"
    q.write_text('{"on_disk_bytes": "1502403"}')
    cand = CandidateConfig(name="good", engine="transformers", model=fx / "models" / "good", store=None, head=None,
                           size_bytes=None, tags=())
    with pytest.raises(VerificationError, match=r"quantization.json: on_disk_bytes: expected an integer, found a string '1502403'"):
        candidate_size_bytes(cand)


def test_tails_json_with_infinity_refused_by_publish(published: dict[str, Path], base: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    shutil.copytree(published["reports"], reports)
    (reports / "tails.json").write_text('{"schema": "fidelity.tails/1", "candidates": [], "x": Infinity}')
    refused(capsys, ["publish", "--reports", str(reports), "--suite", str(base / "suite"), "--out", str(tmp_path / "p")],
            "tails.json: number: expected finite JSON numbers, found Infinity", absent=tmp_path / "p")


# ============================================================================= 5. writes that cannot half-happen


def test_replay_out_over_the_candidates_manifest_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, replay_args(fx, fx / "cand" / "capture.json", "--shards", "0"),
            "cand/capture.json: replay --out output: it would overwrite or write inside its own input", code=2, untouched=fx / "cand")


def test_replay_out_inside_the_reference_store_refused(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, replay_args(fx, fx / "reference" / "reports"), "replay --out output: it would overwrite or write inside its own input",
            code=2, untouched=fx / "reference")


def test_second_kld_import_of_another_file_touches_nothing(fx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kld", "export", "--suite", str(fx / "suite"), "--reference", str(fx / "reference"),
                 "--head", str(fx / "lm_head.safetensors"), "--out", str(fx / "a.kld")]) == 0
    assert main(["kld", "export", "--suite", str(fx / "suite"), "--reference", str(fx / "cand"),
                 "--head", str(fx / "lm_head.safetensors"), "--out", str(fx / "b.kld")]) == 0
    assert main(["kld", "import", str(fx / "a.kld"), "--out", str(fx / "imp")]) == 0
    capsys.readouterr()
    refused(capsys, ["kld", "import", str(fx / "b.kld"), "--out", str(fx / "imp")],
            "imp/reference/capture.json: existing reference store (a store is never overwritten): expected an import of b.kld",
            untouched=fx / "imp")
    refused(capsys, ["kld", "import", str(fx / "a.kld"), "--out", str(fx / "imp"), "--shards", "2"],
            "imp/suite/suite.json: existing suite (a store is never overwritten)", untouched=fx / "imp")


def test_suite_build_over_another_suite_touches_nothing(fx: Path, tiny_corpus: Path, tiny_tokenizer: Path) -> None:
    from harness.inputs.suite import build_suite

    before = snapshot(fx / "suite")
    with pytest.raises(VerificationError, match=r"suite/suite.json: existing suite \(a suite is never overwritten by another\)"):
        build_suite(tiny_corpus, tiny_tokenizer, n_ctx=32, n_contexts=8, n_shards=4, seed=1, out=fx / "suite")
    assert snapshot(fx / "suite") == before
    # the same build again is no overwrite: it is accepted (idempotent)
    build_suite(tiny_corpus, tiny_tokenizer, n_ctx=32, n_contexts=8, n_shards=4, seed=0, out=fx / "suite")
    assert snapshot(fx / "suite") == before


def test_export_head_over_another_head_touches_nothing(fx: Path, capsys: pytest.CaptureFixture[str], tiny_model_factory: Any) -> None:
    other = tiny_model_factory(fx / "models" / "other", seed=9)
    capsys.readouterr()
    before = (fx / "lm_head.safetensors").read_bytes(), (fx / "lm_head.json").read_bytes()
    refused(capsys, ["export-head", "--model", str(other), "--out", str(fx / "lm_head.safetensors")],
            "lm_head.safetensors: existing head (a head is never overwritten by another)")
    assert ((fx / "lm_head.safetensors").read_bytes(), (fx / "lm_head.json").read_bytes()) == before


def _fail_on_call(monkeypatch: pytest.MonkeyPatch, name: str, n: int, err: int = errno.ENOSPC) -> None:
    """``os.<name>`` raises ``OSError(err)`` on its ``n``-th call (1-based), like a disk that fills up."""
    real = getattr(os, name)
    calls = {"n": 0}

    def fake(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            raise OSError(err, os.strerror(err))
        return real(*a, **k)

    monkeypatch.setattr(os, name, fake)


def test_disk_full_during_replay_writes_nothing(fx: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_on_call(monkeypatch, "fsync", 3)  # the third of four staged report files
    refused(capsys, replay_args(fx, fx / "out", "--shards", "0,1"), "out/shard-01.json: cannot write: OSError: No space left on device",
            code=2, untouched=fx / "cand")
    assert not (fx / "out").exists() or list((fx / "out").iterdir()) == []


def test_rename_failure_midway_leaves_no_partial_ladder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.errors import OutputError
    from harness.io.atomic import atomic_write_files

    _fail_on_call(monkeypatch, "replace", 2, errno.EACCES)
    with pytest.raises(OutputError, match=r"ladder.json: cannot write: PermissionError: Permission denied"):
        atomic_write_files({tmp_path / "ladder.md": "md", tmp_path / "ladder.json": "{}"})
    assert list(tmp_path.iterdir()) == []


def test_disk_full_during_publish_leaves_no_set(published: dict[str, Path], base: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_on_call(monkeypatch, "fsync", 4)
    refused(capsys, ["publish", "--reports", str(published["reports"]), "--suite", str(base / "suite"), "--out", str(tmp_path / "p")],
            "cannot write: OSError: No space left on device", code=2, absent=tmp_path / "p")
    assert [p.name for p in tmp_path.iterdir()] == []  # no staging folder left


def test_aggregate_into_an_unwritable_place_is_a_named_error(published: dict[str, Path], base: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("not a folder")
    refused(capsys, ["aggregate", str(published["reports"]), "--suite", str(base / "suite"), "--out", str(tmp_path / "file" / "agg")],
            "file/agg", "cannot create the folder", code=2)
    assert (tmp_path / "file").read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_read_only_report_folder_is_a_named_error(published: dict[str, Path], base: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        refused(capsys, ["aggregate", str(published["reports"]), "--suite", str(base / "suite"), "--out", str(ro)],
                "cannot write: PermissionError", code=2)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_written_files_honour_the_umask(tmp_path: Path, mask: int) -> None:
    from harness.io.atomic import atomic_write_files

    old = os.umask(mask)
    try:
        atomic_write_files({tmp_path / "a.json": "{}", tmp_path / "sub" / "b.md": "x"})
    finally:
        os.umask(old)
    for p in (tmp_path / "a.json", tmp_path / "sub" / "b.md"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask


def test_published_set_is_readable_by_others(published: dict[str, Path]) -> None:
    old = os.umask(0)
    os.umask(old)
    for p in published["pub"].rglob("*"):
        if p.is_file():
            assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~old, p


#: Refusal cases in this campaign (parametrized cases counted one by one); docs/refuses.md cites it.
TRUST_CASES = 62


def test_case_count_is_what_the_readme_says() -> None:
    import inspect
    import sys

    mod = sys.modules[__name__]
    plain = [n for n, f in inspect.getmembers(mod, inspect.isfunction)
             if n.startswith("test_") and n not in ("test_case_count_is_what_the_readme_says", "test_baseline_for_shard_100_round_trips",
                                                     "test_lossless_candidate_runs_end_to_end", "test_a_101_shard_suite_runs_end_to_end",
                                                     "test_written_files_honour_the_umask", "test_published_set_is_readable_by_others",
                                                     "test_publish_recomputes_verdicts_and_never_copies_them")
             and not hasattr(f, "pytestmark")]
    n = len(plain) + len(RECONCILE) + len(BASELINES) + len(PAIRS) + 1  # + the read-only case (skipped as root)
    assert n == TRUST_CASES, n
    readme = (Path(__file__).resolve().parents[1] / "docs" / "refuses.md").read_text()
    assert f"**{TRUST_CASES} cases**" in readme


# ============================================================================= edge cases that must run


def test_lossless_candidate_runs_end_to_end(fx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """KLD exactly 0 everywhere: replay, aggregate, ladder, publish and verify all complete."""
    lossless_copy(fx)
    reports = tmp_path / "reports"
    assert main(replay_args(fx, reports / "lossless", "--name", "lossless", cand="lossless")) == 0
    rep = json.loads((reports / "lossless" / "shard-00.json").read_text())
    assert rep["metrics"]["kld"]["mean"] == 0.0 and rep["metrics"]["kld"]["max"] == 0.0
    assert main(["aggregate", str(reports), "--suite", str(fx / "suite"), "--out", str(tmp_path / "agg")]) == 0
    agg = json.loads((tmp_path / "agg" / "lossless" / "aggregate.json").read_text())
    assert agg["kld"]["mean"] == 0.0 and agg["kld"]["ci95"] == [0.0, 0.0] and agg["top1"]["agreement"] == 1.0
    assert all(b == [0.0, 0.0] for b in agg["kld"]["quantile_bounds"].values())  # finite: KLD >= 0 and max 0
    assert (tmp_path / "agg" / "ladder.md").is_file() and (tmp_path / "agg" / "ladder.json").is_file()
    assert main(["publish", "--reports", str(reports), "--suite", str(fx / "suite"), "--out", str(tmp_path / "pub")]) == 0
    assert main(["verify", str(tmp_path / "pub")]) == 0


def _tiny_world(root: Path, n_contexts: int, n_ctx: int = 4, vocab: int = 48, hidden: int = 8) -> dict[str, Path]:
    """A synthetic suite of ``n_contexts`` one-context shards with a reference and a candidate store
    (random bf16 hidden states) and a head whose sidecar names the reference model."""
    from harness.capture.store import StoreWriter
    from harness.engines.identity import runtime_identity
    from harness.io.atomic import atomic_write_json
    from harness.llamacpp.kld_tools import suite_from_tokens

    rng = np.random.default_rng(0)
    suite = suite_from_tokens(rng.integers(0, vocab, size=(n_contexts, n_ctx)), vocab, root / "suite", n_shards=n_contexts)
    ref_model = {"name": "ref", "config_sha256": "1" * 64, "weights": {"model.safetensors": "2" * 64}}
    cand_model = {"name": "cand", "config_sha256": "1" * 64, "weights": {"model.safetensors": "3" * 64}}
    gen = torch.Generator().manual_seed(0)
    for name, model, noise in (("reference", ref_model, 0.0), ("cand", cand_model, 0.3)):
        with StoreWriter(root / name, suite, "hidden_states", hidden, "bfloat16", model, {"name": "synthetic", "version": "1"},
                         runtime_identity(), "cpu") as w:
            for i in range(n_contexts):
                g = torch.Generator().manual_seed(1000 + i)
                base = torch.randn(n_ctx - 1, hidden, generator=g)
                w.write(i, (base + noise * torch.randn(n_ctx - 1, hidden, generator=gen)).to(torch.bfloat16))
    head = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    (root / "lm_head.safetensors").write_bytes(save({"weight": head}))
    atomic_write_json(root / "lm_head.json", {"sha256": sha256_file(root / "lm_head.safetensors"), "vocab_size": vocab,
                                              "hidden_size": hidden, "dtype": "bfloat16", "source_model": ref_model})
    return {"suite": root / "suite", "reference": root / "reference", "cand": root / "cand", "head": root / "lm_head.safetensors"}


@pytest.mark.slow
def test_a_101_shard_suite_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """101 shards (shard 100 included): replay, aggregate, a baseline for shard 100, publish, verify."""
    from harness.gate.baselines import Baseline, headline_of, write_baseline

    w = _tiny_world(tmp_path, 101)
    reports = tmp_path / "reports" / "cand"
    assert main(["replay", "--suite", str(w["suite"]), "--reference", str(w["reference"]), "--candidate", str(w["cand"]),
                 "--head", str(w["head"]), "--n-boot", "100", "--name", "cand", "--out", str(reports)]) == 0
    assert (reports / "shard-100.json").is_file() and len(list(reports.glob("shard-*.json"))) == 101
    assert main(["aggregate", str(tmp_path / "reports"), "--suite", str(w["suite"]), "--out", str(tmp_path / "agg")]) == 0
    agg = json.loads((tmp_path / "agg" / "cand" / "aggregate.json").read_text())
    assert agg["complete"] and [s["index"] for s in agg["shards"]] == list(range(101)) and agg["n_positions"] == 101 * 3
    r100 = json.loads((reports / "shard-100.json").read_text())["metrics"]
    h = headline_of(r100)
    path = write_baseline(tmp_path / "baselines", "cand", {100: h})
    assert Baseline.load(path, "cand").check(100, h) == []
    assert main(["publish", "--reports", str(tmp_path / "reports"), "--suite", str(w["suite"]), "--baselines",
                 str(tmp_path / "baselines"), "--out", str(tmp_path / "pub")]) == 0
    assert main(["verify", str(tmp_path / "pub")]) == 0
