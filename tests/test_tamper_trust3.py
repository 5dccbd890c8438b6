"""Fourth tamper campaign: every file the harness reads back is checked by its schema and against what it
describes, mixed-scheme quantization configurations are checked group by group, settings that change
numbers key the capture cache, and a planted hand-over file is not believed by a real ``-n 2`` run.

Each case plants ONE hostile thing and checks the refusal names the file, the key, the expected and the found
value (or that the thing is not believed), with nothing deleted and nothing partial left.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.errors import VerificationError

# ----------------------------------------------------------------------------- adaptive.json


def _resealed_verify_output(pub: Path, res: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    """Write a tampered ``results.json`` into the published set ``pub`` and reseal its checksums (so only the
    re-derivation can see the lie); ``fidelity verify`` must then refuse it: its output, for the message check."""
    from harness.cli.main import main
    from harness.reports.report_set import write_checksums

    (pub / "results.json").write_text(json.dumps(res))
    (pub / "checksums.txt").unlink()
    write_checksums(pub)
    capsys.readouterr()
    assert main(["verify", str(pub)]) != 0
    got = capsys.readouterr()
    return got.out + got.err


def _rows(n_clusters: int, shards: int, seed: int) -> dict[int, list[dict[str, Any]]]:
    """Per-shard per-context rows (``cluster``, ``positions``, ``sum_kld``) of one candidate."""
    rng = np.random.default_rng(seed)
    out: dict[int, list[dict[str, Any]]] = {}
    for s in range(shards):
        out[s] = [{"cluster": f"c{s}-{c}", "positions": 31, "sum_kld": float(rng.gamma(2.0, 0.01) * 31)}
                  for c in range(n_clusters)]
    return out


def _adaptive_doc(tmp_path: Path, rows: dict[str, dict[int, list[dict[str, Any]]]], threshold: float) -> dict[str, Any]:
    """An ``adaptive.json`` written by the harness's own monitor and writer from ``rows``."""
    from harness.gate.adaptive import AdaptiveMonitor, write_adaptive

    mon = AdaptiveMonitor(planned={c: sorted(r) for c, r in rows.items()}, thresholds={c: threshold for c in rows}, n_boot=200)
    records = []
    for cand, per_shard in rows.items():
        for shard, ctx in per_shard.items():
            d = mon.observe(cand, shard, {"contexts": ctx})
            records.append({"candidate": cand, "shard": shard, **d.record()})
    write_adaptive(tmp_path, records)
    doc: dict[str, Any] = json.loads((tmp_path / "adaptive.json").read_text())
    return doc


def test_adaptive_json_written_by_the_harness_passes_and_its_means_are_the_reports(tmp_path: Path) -> None:
    from harness.gate.adaptive import check_adaptive

    rows = {"a": _rows(25, 3, 1), "b": _rows(25, 3, 2)}
    doc = _adaptive_doc(tmp_path, rows, threshold=0.02)
    check_adaptive(doc, tmp_path / "adaptive.json", rows)
    assert any(r["ci"] is not None for r in doc["looks"])  # 50 clusters from look 2: bounds are computed
    for r in doc["looks"]:  # the means against an independent float64 sum over the shards so far
        seen = [s for s in range(3) if s <= r["shard"]]
        ctx = [x for s in seen for x in rows[r["candidate"]][s]]
        assert r["mean_kld"] == pytest.approx(math.fsum(x["sum_kld"] for x in ctx) / (31 * len(ctx)), rel=1e-12)


def _edit(doc: dict[str, Any], case: str) -> None:
    look = doc["looks"][1]  # candidate a, look 2: bounds present
    if case == "version":
        doc["schema"] = "fidelity.adaptive/2"
    elif case == "missing":
        del look["mean_kld"]
    elif case == "extra":
        doc["looks"][0]["verdict"] = "pass"
    elif case == "type":
        look["clusters"] = "50"
    elif case == "nan":
        look["mean_kld"] = float("nan")
    elif case == "mean":
        look["mean_kld"] = 0.0
    elif case == "side":
        look["side"] = "below" if look["side"] != "below" else "above"
    elif case == "alpha":
        doc["alpha_side"] = 0.25
    elif case == "shard":
        look["shard"] = 7
    elif case == "candidate":
        for r in doc["looks"]:
            if r["candidate"] == "b":
                r["candidate"] = "c"
    elif case == "level":
        look["level"] = 0.5


@pytest.mark.parametrize("case, pattern", [
    ("version", r"adaptive\.json: schema: expected \"fidelity\.adaptive/1\", found a string 'fidelity\.adaptive/2'"),
    ("missing", r"adaptive\.json: looks\[1\]\.mean_kld: expected present, found missing"),
    ("extra", r"adaptive\.json: looks\[0\]\.verdict: expected no such key \(known: candidate, .*\), found present"),
    ("type", r"adaptive\.json: looks\[1\]\.clusters: expected an integer, found a string '50'"),
    ("nan", r"adaptive\.json: number: expected finite JSON numbers, found NaN"),
    ("mean", r"adaptive\.json: looks\[1\]\.mean_kld: expected 0\.0\d+ \(shards \[0, 1\] of a's reports\), found 0\.0"),
    ("side", r"adaptive\.json: looks\[1\]\.side: expected .* \(its bounds \[.*\] and threshold 0\.02\), found \"(below|above)\""),
    ("alpha", r"adaptive\.json: alpha_side: expected 0\.025, found a number 0\.25"),
    ("shard", r"adaptive\.json: looks\[1\]\.shard: expected a shard a has a report for, once \(\[0, 1, 2\]\), found 7"),
    ("candidate", r"adaptive\.json: looks\[3\]\.candidate: expected a candidate with shard reports \(a, b\), found c"),
    ("level", r"adaptive\.json: looks\[1\]\.level: expected 1 - 2 alpha_k = 0\.9\d+ .*, found 0\.5"),
])
def test_adaptive_json_that_lies_is_refused(tmp_path: Path, case: str, pattern: str) -> None:
    """Publish reads a run's ``adaptive.json`` back into results.json: a wrong version, a missing or unknown
    key, a wrong type, a NaN, or a look whose numbers do not follow from the shard reports is refused by name."""
    from harness.gate.adaptive import check_adaptive
    from harness.io.jsonio import read_json

    rows = {"a": _rows(25, 3, 1), "b": _rows(25, 3, 2)}
    doc = _adaptive_doc(tmp_path, rows, threshold=0.02)
    _edit(doc, case)
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(doc))  # json.dumps writes NaN as the bare word: the strict reader refuses it
    with pytest.raises(VerificationError, match=pattern):
        check_adaptive(read_json(path), path, rows)


@pytest.mark.slow  # one run of the tiny project (shared fixture), then publish
def test_publish_and_verify_refuse_a_lying_adaptive_json(fidelity_run: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Through the commands: ``publish`` refuses a report folder whose adaptive.json lies (exit 1, named, no
    output folder), publishes one the harness wrote, and ``verify`` refuses a published set whose
    results.json ``adaptive`` block was edited and resealed."""
    from harness.cli.main import main
    from harness.io.jsonio import read_json

    root = tmp_path / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    reps = root / "reports"
    rows = {c: {int(f.stem[6:]): read_json(f)["metrics"]["contexts"] for f in sorted((reps / c).glob("shard-*.json"))}
            for c in ("good", "bad")}
    doc = _adaptive_doc(tmp_path, rows, threshold=0.01)
    doc["looks"][2]["mean_kld"] *= 0.5
    (reps / "adaptive.json").write_text(json.dumps(doc))
    args = ["publish", "--reports", str(reps), "--config", str(root / "fidelity.toml")]
    assert main([*args, "--out", str(tmp_path / "pub1")]) == 1
    err = capsys.readouterr().err
    assert f"{reps / 'adaptive.json'}: looks[2].mean_kld: expected " in err and "found" in err
    assert not (tmp_path / "pub1").exists()
    doc = _adaptive_doc(tmp_path, rows, threshold=0.01)
    (reps / "adaptive.json").write_text(json.dumps(doc))
    assert main([*args, "--out", str(tmp_path / "pub2")]) == 0
    assert main(["verify", str(tmp_path / "pub2")]) == 0
    res = json.loads((tmp_path / "pub2" / "results.json").read_text())
    assert res["adaptive"] == doc
    res["adaptive"]["looks"][0]["clusters"] += 1
    assert ("results.json: adaptive: looks[0].clusters: expected 2 (shards [0] of bad's reports), found 3"
            in _resealed_verify_output(tmp_path / "pub2", res, capsys))


# ----------------------------------------------------------------------------- provenance records


@pytest.mark.parametrize("text, pattern", [
    ('{"schema": "fidelity.corpus-provenance/2"}', r"provenance\.json: schema: expected \"fidelity\.corpus-provenance/1\", "
                                                  r"found a string 'fidelity\.corpus-provenance/2'"),
    ('{"default": {"licence": "MIT"}}', r"provenance\.json: schema: expected present, found missing"),
    ('{"schema": "fidelity.corpus-provenance/1", "default": {"licence": "MIT", "licenses": "x"}}',
     r"provenance\.json: default\.licenses: expected no such key \(known: source, licence\), found present"),
    ('{"schema": "fidelity.corpus-provenance/1", "documents": {"a.txt": {"source": 3}}}',
     r"provenance\.json: documents\.a\.txt\.source: expected null or a string, found an integer 3"),
    ('{"schema": "fidelity.corpus-provenance/1", "documents": {"a.txt": {"source": NaN}}}',
     r"provenance\.json: number: expected finite JSON numbers, found NaN"),
    ('{"schema": "fidelity.corpus-provenance/1", "default": {}, "default": {"licence": "MIT"}}',
     r"provenance\.json: JSON key 'default': expected each key once, found listed twice"),
    ('{"schema": "fidelity.corpus-provenance/1", "documents": []}',
     r"provenance\.json: documents: expected an object of an object \{source, licence\} \(no other key\), found an array \[\]"),
])
def test_provenance_sidecar_that_lies_is_refused(tmp_path: Path, text: str, pattern: str) -> None:
    """The corpus sidecar is read strictly and against its closed schema: wrong version, missing version, an
    unknown key (a misspelt ``licenses`` would otherwise attribute nothing), a wrong type, a NaN, a key twice."""
    from harness.inputs.provenance import document_records

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text\n")
    (corpus / "provenance.json").write_text(text)
    with pytest.raises(VerificationError, match=pattern):
        document_records(corpus, ["a.txt"])


def _reseal_documents(tmp_path: Path, tiny_suite: Path, edit: Any) -> Path:
    from harness.inputs.suite import manifest_sha256

    d = tmp_path / "s"
    shutil.copytree(tiny_suite, d)
    doc = json.loads((d / "suite.json").read_text())
    edit(doc["documents"][min(doc["documents"])], doc)
    try:
        doc["manifest_sha256"] = manifest_sha256(doc)
    except ValueError:  # a NaN has no canonical JSON: left unsealed (the reader refuses it first)
        pass
    (d / "suite.json").write_text(json.dumps(doc))
    return d


@pytest.mark.parametrize("case, pattern", [
    ("missing", r"suite\.json: documents\..*\.licence: expected present, found missing"),
    ("extra", r"suite\.json: documents\..*\.url: expected no such key \(known: sha256, bytes, source, licence\), found present"),
    ("type", r"suite\.json: documents\..*\.sha256: expected a string, found an integer 7"),
    ("nan", r"suite\.json: number: expected finite JSON numbers, found NaN"),
    ("sha", r"suite\.json: documents\..*\.sha256: expected 64 lower-case hex digits, found 'abc'"),
    ("negative", r"suite\.json: documents\..*\.bytes: expected a size >= 0, found -1"),
    ("parent", r"suite\.json: documents\['\.\./x\.txt'\]: expected a relative path inside the corpus, found \.\./x\.txt"),
    ("block", r"suite\.json: documents: expected an object of an object \{sha256, bytes, source, licence\} \(no other key\), found null"),
])
def test_suite_provenance_records_that_lie_are_refused(tmp_path: Path, tiny_suite: Path, case: str, pattern: str) -> None:
    """A resealed ``suite.json`` (its manifest hash re-computed) whose per-document records lie is refused when
    the suite loads, before any document is opened or any card renders them."""
    from harness.inputs.suite import Suite

    def edit(rec: dict[str, Any], doc: dict[str, Any]) -> None:
        if case == "missing":
            del rec["licence"]
        elif case == "extra":
            rec["url"] = "http://x"
        elif case == "type":
            rec["sha256"] = 7
        elif case == "nan":
            rec["bytes"] = float("nan")
        elif case == "sha":
            rec["sha256"] = "abc"
        elif case == "negative":
            rec["bytes"] = -1
        elif case == "parent":
            doc["documents"]["../x.txt"] = dict(rec)
        elif case == "block":
            doc["documents"] = None

    d = _reseal_documents(tmp_path, tiny_suite, edit)
    with pytest.raises(VerificationError, match=pattern):
        Suite.load(d)


# ----------------------------------------------------------------------------- mixed-scheme compressed-tensors

_MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "model"
_INT4 = r"re:.*mlp\.(gate|up)_proj$"
_INT8 = r"re:.*self_attn\.(q|k|v|o)_proj$"
_FP8 = r"re:.*down_proj$"


def _build_mixed(dst: Path) -> Path:
    """A real compressed-tensors checkpoint of the fixture model with three schemes, made by the
    ``compressed-tensors`` package itself: int4 groups of 32 (packed) on gate/up, int8 per channel (packed) on
    the attention projections, fp8 per channel on down_proj, and layer 1's down_proj ignored (bf16).
    Round-to-nearest: each scale from the weights' min/max by compressed-tensors' ``calculate_qparams``."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(_MODEL, dtype=torch.bfloat16)
    groups = {
        "int4": QuantizationScheme(targets=[_INT4], weights=QuantizationArgs(num_bits=4, type="int", symmetric=True,
                                                                            strategy="group", group_size=32)),
        "int8": QuantizationScheme(targets=[_INT8], weights=QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel")),
        "fp8": QuantizationScheme(targets=[_FP8], weights=QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="channel")),
    }
    apply_quantization_config(model, QuantizationConfig(config_groups=groups, ignore=["lm_head", "model.layers.1.mlp.down_proj"]))
    for _name, m in model.named_modules():
        scheme = getattr(m, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        a, w = scheme.weights, m.weight.data.float()
        rows = w.reshape(w.shape[0], -1, a.group_size) if a.strategy == "group" else w.unsqueeze(1)
        scale, zp = calculate_qparams(rows.amin(-1), rows.amax(-1), a)
        m.weight_scale.data.copy_(scale.to(m.weight_scale.dtype).reshape(m.weight_scale.shape))
        m.weight_zero_point.data.copy_(zp.to(m.weight_zero_point.dtype).reshape(m.weight_zero_point.shape))
        m.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(dst)
    compressor.update_config(str(dst))
    return dst


@pytest.fixture(scope="module")
def mixed_ct(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_mixed(tmp_path_factory.mktemp("ct") / "mixed")


def _mixed_copy(mixed_ct: Path, tmp_path: Path) -> tuple[Path, dict[str, Any], dict[str, str]]:
    """A copy of the mixed checkpoint, its ``quantization_config`` and the group key of each scheme."""
    root = tmp_path / "m"
    shutil.copytree(mixed_ct, root)
    qc = json.loads((root / "config.json").read_text())["quantization_config"]
    keys = {}
    for k, g in qc["config_groups"].items():  # compressed-tensors renames the groups: find them by target
        keys[{_INT4: "int4", _INT8: "int8", _FP8: "fp8"}[g["targets"][0]]] = k
    return root, qc, keys


def _write_qc(root: Path, qc: dict[str, Any]) -> None:
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"] = qc
    (root / "config.json").write_text(json.dumps(cfg))


def test_mixed_scheme_checkpoint_passes_and_loads_with_each_groups_scheme(mixed_ct: Path, tmp_path: Path) -> None:
    """The untouched checkpoint passes the check and loads through the harness; each module's loaded weight
    is within its own scheme's rounding error of the source weight (half a scale step: int4 / int8 by their
    group or channel absmax; fp8 e4m3 relative 2^-4), and layer 1's ignored down_proj is the source exactly."""
    import torch
    from transformers import AutoModelForCausalLM

    from harness.engines.compressed_config import check_compressed_tensors
    from harness.engines.transformers import load_model

    _root, qc, keys = _mixed_copy(mixed_ct, tmp_path)
    assert qc["format"] == "mixed-precision" and set(keys) == {"int4", "int8", "fp8"}
    check_compressed_tensors(mixed_ct)
    model = load_model(mixed_ct)
    with torch.inference_mode():
        model(input_ids=torch.arange(1, 9).unsqueeze(0))  # compressed-tensors decompresses on the first forward
    got = {f"{name}.weight": m.weight.detach() for name, m in model.named_modules() if isinstance(getattr(m, "weight", None), torch.Tensor)}
    src = {k: v.float() for k, v in AutoModelForCausalLM.from_pretrained(_MODEL, dtype=torch.bfloat16).named_parameters()}
    for layer in (0, 1):
        p = f"model.layers.{layer}."
        # symmetric int b: scale = absmax / (2^(b-1) - 1/2), codes clamped to [-2^(b-1), 2^(b-1) - 1] (the top value
        # rounds one code down: half a step times 2^(b-1) / (2^(b-1) - 1)); compressed-tensors divides in bf16 and the
        # scale and the result are bf16 (each at most 2^-9 |w|: 2^-7 |w| covers the three)
        for lin, g, b in (("mlp.gate_proj", 32, 4), ("self_attn.q_proj", 128, 8)):
            w, q = src[p + lin + ".weight"].double(), got[p + lin + ".weight"].double()
            absmax = w.reshape(w.shape[0], -1, g).abs().amax(-1, keepdim=True)
            step = absmax / (2 ** (b - 1) - 0.5)
            err = (q - w).reshape(w.shape[0], -1, g).abs()
            bound = step / 2 * 2 ** (b - 1) / (2 ** (b - 1) - 1) + w.reshape(err.shape).abs() * 2.0**-7
            assert bool((err <= bound).all()), (p + lin, float((err / step).max()))
            # and it is that many bits: 4-bit codes err by several 8-bit steps on average, 8-bit ones by less than one
            assert (float((err / (absmax / 127.5)).mean()) > 2.0) == (b == 4), (p + lin, b)
        w, q = src[p + "mlp.down_proj.weight"].double(), got[p + "mlp.down_proj.weight"].double()
        if layer == 1:
            assert torch.equal(w, q)  # ignored: bf16 as stored
        else:  # e4m3: 3 mantissa bits (relative 2^-4), subnormals below 2^-6 of the per-channel scale absmax / 448
            scale = w.abs().amax(-1, keepdim=True) / 448
            bound = w.abs() * 2.0**-4 + scale * 2.0**-9 + w.abs() * 2.0**-7
            assert bool(((q - w).abs() <= bound).all()) and not torch.equal(w, q)


@pytest.mark.parametrize("case, pattern", [
    ("int4_bits", r"model\.safetensors: model\.layers\.0\.mlp\.gate_proj\.weight_packed shape \(config\.json quantization_config"
                  r"\.config_groups\.{int4}\.weights\.num_bits 8, weight_shape \[384, 128\]\): expected \[384, 32\], found \[384, 16\]"),
    ("int8_bits", r"model\.safetensors: model\.layers\.0\.self_attn\.k_proj\.weight_packed shape \(config\.json .*{int8}"
                  r"\.weights\.num_bits 4, weight_shape \[64, 128\]\): expected \[64, 16\], found \[64, 32\]"),
    ("group_size", r"model\.layers\.0\.mlp\.gate_proj\.weight_scale shape \(config\.json .*{int4}\.weights: group, group_size 64\): "
                   r"expected \[384, 2\], found \[384, 4\]"),
    ("fp8_as_int", r"model\.safetensors: model\.layers\.0\.mlp\.down_proj\.weight dtype \(config\.json .*{fp8}\.weights\.num_bits 8, "
                   r"int, naive-quantized\): expected I8 with num_bits <= 8, found F8_E4M3 with num_bits 8"),
    ("format", r"config\.json: model\.layers\.0\.mlp\.down_proj tensors \(.*{fp8}\.weights: pack-quantized\): expected weight_packed, "
               r"found weight F8_E4M3 \[128, 384\], weight_scale BF16 \[128, 1\]"),
    ("shape", r"model\.safetensors: model\.layers\.1\.self_attn\.o_proj\.weight_packed shape \(config\.json .*{int8}\.weights\.num_bits 8, "
              r"weight_shape \[128, 256\]\): expected \[128, 64\], found \[128, 32\]"),
    ("overlap", r"config\.json: quantization_config\.config_groups targets matching model\.layers\.0\.mlp\.up_proj: "
                r"expected one group \(by pattern\), found 2: "),
    ("unignored", r"model\.safetensors: model\.layers\.1\.mlp\.down_proj \(config\.json .*{fp8}\.weights: naive-quantized, matched by "
                  r"pattern\): expected quantized tensors, found weight BF16 \[128, 384\]"),
    ("ignored", r"model\.safetensors: model\.layers\.0\.self_attn\.q_proj \(config\.json quantization_config\.ignore\[2\] "
                r"'model\.layers\.0\.self_attn\.q_proj'\): expected a plain weight \(an ignored module is not quantized\), "
                r"found weight_packed I32 \[128, 32\], weight_scale BF16 \[128, 1\], weight_shape I64 \[2\]"),
    ("unmatched", r"model\.safetensors: model\.layers\.0\.self_attn\.o_proj \(config\.json quantization_config\.config_groups\): "
                  r"expected a group whose targets match this quantized module, found none"),
])
def test_mixed_scheme_config_that_lies_is_refused(mixed_ct: Path, tmp_path: Path, case: str, pattern: str) -> None:
    """A lie in any one group of a mixed-scheme configuration (bits, group size, dtype, format, the stored shape),
    a module matched by two groups, an ignore list that does not fit the tensors, a quantized module no group
    matches: refused before loading, naming the file, the tensor, the expected and the found value."""
    import torch

    from harness.engines.transformers import load_model

    root, qc, keys = _mixed_copy(mixed_ct, tmp_path)
    groups = qc["config_groups"]
    if case == "int4_bits":
        groups[keys["int4"]]["weights"]["num_bits"] = 8
    elif case == "int8_bits":
        groups[keys["int8"]]["weights"]["num_bits"] = 4
    elif case == "group_size":
        groups[keys["int4"]]["weights"]["group_size"] = 64
    elif case == "fp8_as_int":
        groups[keys["fp8"]]["weights"]["type"] = "int"
    elif case == "format":
        groups[keys["fp8"]]["format"] = "pack-quantized"
    elif case == "shape":
        _edit_weights(root, lambda t: t.__setitem__("model.layers.1.self_attn.o_proj.weight_shape", torch.tensor([128, 256])))
    elif case == "overlap":
        groups[keys["int8"]]["targets"].append(r"re:.*layers\.0\.mlp\.up_proj$")
    elif case == "unignored":
        qc["ignore"].remove("model.layers.1.mlp.down_proj")
    elif case == "ignored":
        qc["ignore"].append("model.layers.0.self_attn.q_proj")
    elif case == "unmatched":
        groups[keys["int8"]]["targets"] = [r"re:.*self_attn\.(q|k|v)_proj$", r"re:.*layers\.1\.self_attn\.o_proj$"]
    _write_qc(root, qc)
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    with pytest.raises(VerificationError, match=pattern.format(**{k: re.escape(v) for k, v in keys.items()})):
        load_model(root, "cpu", "float32")
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before  # nothing written, nothing removed


def _edit_weights(root: Path, edit: Any) -> None:
    from safetensors.torch import load_file, save_file

    for f in root.glob("*.safetensors"):
        tensors = load_file(f)
        edit(tensors)
        save_file(tensors, f, metadata={"format": "pt"})


# ----------------------------------------------------------------------------- settings that change numbers


def test_a_setting_that_changes_numbers_gets_its_own_capture(tmp_path: Path, fidelity_project: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            session_captures: list[Path]) -> None:
    """A live candidate captured under one setting is captured again (into another cache folder, the first
    untouched) when a kernel/ISA variable torch reads changes, and reused when a variable that does not change
    numbers (a vLLM memory size, for a transformers candidate) changes -- each run a new session, as a rerun is."""
    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession

    shutil.copytree(fidelity_project, tmp_path / "p", symlinks=True)
    captured = session_captures
    for var in ("ATEN_CPU_CAPABILITY", "VLLM_CPU_KVCACHE_SPACE", "FIDELITY_UNRELATED"):
        monkeypatch.delenv(var, raising=False)

    def run() -> Path:
        s = FidelitySession(config=load_config(tmp_path / "p" / "fidelity.toml"))
        good = s.config.candidate("good")
        store = s.candidate_store(good, 0)
        assert store.root == s.live_store_path(good)
        return Path(store.root)

    first = run()
    files = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    assert captured == [first]
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "7")  # memory of another engine: not a number of this one
    monkeypatch.setenv("FIDELITY_UNRELATED", "1")
    assert run() == first and captured == [first]  # reused, not captured again
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # read when torch starts: a capture under it is another capture
    second = run()
    assert second != first and second.parent == first.parent and captured == [first, second]
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == files  # the first store untouched
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert run() == first and len(captured) == 2


@pytest.mark.parametrize("engine, changes, same", [
    ("vllm", {"VLLM_CPU_ATTN_SPLIT_KV": "0"}, {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}),
    ("vllm", {"VLLM_CPU_INT4_W4A8": "0"}, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}),
    ("transformers", {"ONEDNN_DEFAULT_FPMATH_MODE": "BF16"}, {"OMP_NUM_THREADS": "3", "VLLM_CPU_ATTN_SPLIT_KV": "0"}),
    ("llamacpp", {"GGML_CPU_TILED_MM": "0"}, {"GGML_TOTAL_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx2"}),
])
def test_numeric_settings_by_engine(engine: str, changes: dict[str, str], same: dict[str, str]) -> None:
    from harness.engines.identity import identity_key
    from harness.engines.numeric_env import numeric_settings

    base = identity_key(numeric_settings(engine, {}))
    assert identity_key(numeric_settings(engine, changes)) != base
    assert identity_key(numeric_settings(engine, same)) == base


def test_vllm_settings_are_variables_the_installed_vllm_reads() -> None:
    """Every vLLM variable keyed is one the installed vLLM's ``envs.py`` declares (the list is not stale)."""
    pytest.importorskip("vllm")
    import vllm.envs

    from harness.engines.numeric_env import VLLM_ENV

    assert [k for k in VLLM_ENV if k not in vllm.envs.environment_variables] == []


def test_handover_binding_holds_the_scoring_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positions scored under another scoring path (``FIDELITY_GEMM``, ``FIDELITY_SCORER_BACKEND``,
    ``FIDELITY_FUSED_BLOCKS``) are bound to it: a hand-over written under one is not believed under another."""
    from types import SimpleNamespace

    from harness.run.shared_scores import binding

    store = SimpleNamespace(identity={"name": "x"}, kind="hidden_states", dtype="bfloat16", width=8, hashes={0: "a"})
    suite = SimpleNamespace(shard_indices=lambda s: [0], suite_token_sha256="s", shard=lambda s: SimpleNamespace(sha256="h"))

    def bound() -> dict[str, Any]:
        return binding(session="x", candidate="good", suite=suite, shard=0, reference=store, cand_store=store,
                       head=None, cand_head=None, window=0, device="cpu")

    for var in ("FIDELITY_GEMM", "FIDELITY_SCORER_BACKEND", "FIDELITY_FUSED_BLOCKS", "FIDELITY_THREADS"):
        monkeypatch.delenv(var, raising=False)
    base = bound()
    monkeypatch.setenv("FIDELITY_THREADS", "1")  # reorders a reduction only
    assert bound() == base
    for var, value in (("FIDELITY_GEMM", "fp32"), ("FIDELITY_SCORER_BACKEND", "torch"), ("FIDELITY_FUSED_BLOCKS", "64")):
        monkeypatch.setenv(var, value)
        assert bound()["scorer"]["env"][var] == value and bound() != base
        monkeypatch.delenv(var)


# ----------------------------------------------------------------------------- a planted hand-over, end to end

MARK = "PLANTED-7f3a"


def _numbers(doc: Any, where: str = "$") -> dict[str, float]:
    """Every number of a JSON document by its path (timings and paths of files left out)."""
    out: dict[str, float] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k not in ("timing", "created", "load_s", "score_s", "scorer_run", "source"):
                out.update(_numbers(v, f"{where}.{k}"))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.update(_numbers(v, f"{where}[{i}]"))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        out[where] = float(doc)
    return out


@pytest.mark.slow  # a real -n 2 run of the tiny project (two workers start torch), after the shared serial run
def test_xdist_run_never_believes_a_planted_handover(fidelity_run: Path, tmp_path: Path) -> None:
    """Before a ``pytest -n 2`` run with a known ``--testrunuid``, its hand-over folder is planted with: for every
    shard of ``good``, a forgery identical to what the workers compute -- the exact binding (session, identities,
    store contents, suite, shard, window, scorer, heads) -- but with KLD 0 and a marker, signed with another key
    (what a killed earlier session of the same id leaves); a truncated file for ``bad`` shard 0; for ``bad`` shard 1
    a symbolic link to a forged file outside. The run's reports equal the serial run's (``-n 0``) numbers, no
    report holds the marker, the linked file outside is untouched, and the run passes."""
    import dataclasses
    import os
    import subprocess
    import sys

    from harness.inputs.config import load_config
    from harness.run.session import FidelitySession
    from harness.run.shared_scores import binding, load_positions, save_positions, shared_dir

    root = tmp_path / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    uid = "planted0run"
    config = load_config(root / "fidelity.toml")
    folder = shared_dir(config.cache_dir, uid)
    folder.mkdir(parents=True)
    session = FidelitySession(config=config)
    forged_key = b"k" * 32

    def forged(name: str, shard: int) -> tuple[Any, dict[str, Any]]:
        cand = config.candidate(name)
        pos, inputs = session.positions(cand, shard), session.shard_inputs(cand, shard)
        bound = binding(session=uid, candidate=name, suite=inputs.suite, shard=shard, reference=inputs.reference,
                        cand_store=inputs.candidate, head=inputs.head, cand_head=inputs.cand_head,
                        window=inputs.score_from, device=session.device)
        zero = np.zeros_like(pos.scores.kld)
        fake = dataclasses.replace(pos, scores=dataclasses.replace(pos.scores, kld=zero, kld_rev=zero, jsd_bits=zero),
                                   scorer_run={"planted": MARK})
        return fake, bound

    for shard in range(4):
        fake, bound = forged("good", shard)
        save_positions(folder / f"good-shard{shard:02d}.npz", fake, bound, forged_key)
        assert float(load_positions(folder / f"good-shard{shard:02d}.npz", bound, forged_key).scores.kld.max()) == 0.0
    fake, bound = forged("bad", 0)
    save_positions(folder / "bad-shard00.npz", fake, bound, forged_key)
    (folder / "bad-shard00.npz").write_bytes((folder / "bad-shard00.npz").read_bytes()[:300])
    victim = tmp_path / "outside" / "victim.npz"
    victim.parent.mkdir()
    fake, bound = forged("bad", 1)
    save_positions(victim, fake, bound, forged_key)
    victim_bytes = victim.read_bytes()
    os.symlink(victim, folder / "bad-shard01.npz")

    out = subprocess.run([sys.executable, "-m", "pytest", "fidelity.toml", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--testrunuid", uid, "-m", "fidelity or fidelity_tails", "--fidelity-report-dir", "par"],
                         cwd=root, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    serial, par = root / "reports", root / "par"
    compared = 0
    for name in ("good", "bad"):
        for shard in range(4):
            want = _numbers(json.loads((serial / name / f"shard-{shard:02d}.json").read_text())["metrics"])
            got = _numbers(json.loads((par / name / f"shard-{shard:02d}.json").read_text())["metrics"])
            assert got.keys() == want.keys()
            for k, v in want.items():
                assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-12), (name, shard, k)
            assert got["$.kld.mean"] > 0
            compared += len(want)
    want_t, got_t = (_numbers(json.loads((d / "tails.json").read_text())["candidates"]) for d in (serial, par))
    # (the serial run wrote the baselines as it ran, so its tails have no baseline p99 to compare with: compared where both have it)
    assert set(want_t) <= set(got_t) and all(got_t[k] == pytest.approx(v, rel=1e-5, abs=1e-12) for k, v in want_t.items())
    compared += len(want_t)
    assert compared > 500
    leaked = [p for p in par.rglob("*") if p.is_file() and MARK.encode() in p.read_bytes()]
    assert leaked == []
    assert victim.read_bytes() == victim_bytes


# ----------------------------------------------------------------------------- a .kld published in parts


@pytest.fixture()
def kld_parts(tmp_path: Path) -> Path:
    from harness.llamacpp.kld_file import write_kld
    from harness.llamacpp.kld_parts import split_file

    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 32, size=(3, 8))
    whole = write_kld(tmp_path / "ref.kld", tokens, 32, [rng.normal(size=(7, 32)).astype(np.float32) for _ in range(3)])
    (tmp_path / "parts").mkdir()
    manifest = split_file(whole, tmp_path / "parts", 300)
    whole.unlink()
    return manifest


@pytest.mark.parametrize("case, pattern", [
    ("version", r"ref\.kld\.parts\.json: schema: expected \"fidelity\.kld-parts/1\", found a string 'fidelity\.kld-parts/2'"),
    ("part_sha_type", r"ref\.kld\.parts\.json: parts\[1\]\.sha256: expected a string, found an integer 7"),
    ("part_sha_missing", r"ref\.kld\.parts\.json: parts\[1\]\.sha256: expected present, found missing"),
    ("sha_missing", r"ref\.kld\.parts\.json: sha256: expected present, found missing"),
    ("sha_form", r"ref\.kld\.parts\.json: sha256: expected 64 lower-case hex digits, found 'ABC'"),
    ("extra", r"ref\.kld\.parts\.json: parts\[0\]\.offset: expected no such key \(known: name, bytes, sha256\), found present"),
    ("file_type", r"ref\.kld\.parts\.json: file: expected a string, found null"),
    ("twice", r"ref\.kld\.parts\.json: parts\[1\]\.name: expected each part once, found ref\.kld\.part-000 listed again"),
    ("nan", r"ref\.kld\.parts\.json: number: expected finite JSON numbers, found NaN"),
    ("symlink", r"ref\.kld\.part-001: part of ref\.kld: expected a file in .*parts, found a symbolic link to .*elsewhere"),
])
def test_kld_parts_manifest_that_lies_is_refused(kld_parts: Path, tmp_path: Path, case: str, pattern: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A parts manifest is read by its closed schema: a wrong version, a digest of the wrong type or missing
    (every part and the whole file are hashed by whoever splits them), an unknown key, a part listed twice, a
    NaN, or a part that is a symbolic link out of the folder is refused by name; ``kld import`` leaves nothing."""
    from harness.cli.main import main
    from harness.llamacpp.kld_parts import open_parts

    doc = json.loads(kld_parts.read_text())
    if case == "version":
        doc["schema"] = "fidelity.kld-parts/2"
    elif case == "part_sha_type":
        doc["parts"][1]["sha256"] = 7
    elif case == "part_sha_missing":
        del doc["parts"][1]["sha256"]
    elif case == "sha_missing":
        del doc["sha256"]
    elif case == "sha_form":
        doc["sha256"] = "ABC"
    elif case == "extra":
        doc["parts"][0]["offset"] = 0
    elif case == "file_type":
        doc["file"] = None
    elif case == "twice":
        doc["parts"][1] = dict(doc["parts"][0])
        doc["bytes"] = sum(p["bytes"] for p in doc["parts"])
    elif case == "nan":
        doc["bytes"] = float("nan")
    elif case == "symlink":
        part = kld_parts.parent / doc["parts"][1]["name"]
        (tmp_path / "elsewhere").mkdir()
        part.rename(tmp_path / "elsewhere" / part.name)
        part.symlink_to(tmp_path / "elsewhere" / part.name)
    kld_parts.write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=pattern):
        open_parts(kld_parts)
    capsys.readouterr()
    assert main(["kld", "import", str(kld_parts), "--out", str(tmp_path / "imp")]) == 1
    assert not (tmp_path / "imp").exists()


# ----------------------------------------------------------------------------- tails.json re-derived by publish


def _edit_tails(doc: dict[str, Any], case: str) -> None:
    c = doc["candidates"][0]
    if case == "shard_p99":
        c["shards"][1]["percentiles"]["p99"] *= 0.5
    elif case == "ccdf":
        c["ccdf"]["y"][-1] *= 0.1
    elif case == "cum_exceedance":
        c["cumulative"]["exceedance"][next(iter(c["cumulative"]["exceedance"]))] += 1
    elif case == "cum_p99":
        c["cumulative"]["percentiles"]["p99"] = c["cumulative"]["quantile_bounds"]["p99"][1] * 2
    elif case == "extra":
        c["verdict"] = "pass"
    elif case == "problems":
        c["problems"] = []
        c["max_p99_baseline"] = 1e-12


@pytest.mark.slow  # one run of the tiny project (shared fixture), then publish
@pytest.mark.parametrize("case, pattern", [
    ("shard_p99", r"tails\.json: candidates\[0\]\.shards\[1\]\.percentiles\.p99: expected [\d.e-]+ \(shard 1's report\), found"),
    ("ccdf", r"tails\.json: candidates\[0\]\.ccdf: expected what the shard reports' summed histograms give, found other values"),
    ("cum_exceedance", r"tails\.json: candidates\[0\]\.cumulative\.exceedance: expected \{.*\} \(the shards' sums\), found"),
    ("cum_p99", r"tails\.json: candidates\[0\]\.cumulative\.percentiles\.p99: expected within \[.*\] \(the summed histograms\), found"),
    ("extra", r"tails\.json: candidates\[0\]\.verdict: expected no such key \(known: schema, candidate, .*\), found present"),
    ("problems", r"tails\.json: candidates\[0\]\.problems: expected \['bad: p99 >= .* > max 1e-12 \(max_p99 of its baseline\)'\], found \[\]"),
])
def test_publish_refuses_tails_that_do_not_follow_from_the_shard_reports(fidelity_run: Path, tmp_path: Path, case: str,
                                                                       pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``publish`` puts a run's tail reports into results.json and draws tails.png from them: every figure a shard
    report also holds must be its, the cumulative ones must add up and the CCDF and brackets must be what the
    summed histograms give -- else refused by name and nothing published. A run's own tails.json publishes."""
    from harness.cli.main import main
    from harness.reports.report_set import _read_tails, load_reports

    root = tmp_path / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    reps = root / "reports"
    groups = load_reports([reps])
    assert _read_tails(reps / "tails.json", groups)["candidates"]  # the run's own file passes
    doc = json.loads((reps / "tails.json").read_text())
    assert doc["candidates"][0]["candidate"] == "bad"
    _edit_tails(doc, case)
    (reps / "tails.json").write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=pattern):
        _read_tails(reps / "tails.json", groups)
    assert main(["publish", "--reports", str(reps), "--config", str(root / "fidelity.toml"), "--out", str(tmp_path / "pub")]) == 1
    assert "tails.json: candidates[0]" in capsys.readouterr().err
    assert not (tmp_path / "pub").exists()


@pytest.mark.slow  # one run of the tiny project (shared fixture), then publish and verify
def test_verify_refuses_resealed_results_with_edited_tails(fidelity_run: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli.main import main

    root = tmp_path / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    pub = tmp_path / "pub"
    assert main(["publish", "--reports", str(root / "reports"), "--config", str(root / "fidelity.toml"), "--out", str(pub)]) == 0
    res = json.loads((pub / "results.json").read_text())
    res["candidates"]["good"]["tails"]["cumulative"]["max"] *= 0.5
    assert "results.json: candidates.good.tails.cumulative: expected " in _resealed_verify_output(pub, res, capsys)


# ----------------------------------------------------------------------------- paired reports re-derived by publish


@pytest.fixture(scope="module")
def paired_run(tmp_path_factory: pytest.TempPathFactory, fidelity_run: Path) -> Path:
    """The tiny project's run plus its declared pair (good vs bad) over the run's shards, computed as the pair
    case computes it (the session's positions from the cached captures, :meth:`PairCase.run`) and written into
    the run's report folder by the plugin's writer."""
    from harness.inputs.config import load_config
    from harness.plugin.kind_paired import PairCase
    from harness.reports.paired import write_paired
    from harness.run.session import FidelitySession

    root = tmp_path_factory.mktemp("paired") / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    config = load_config(root / "fidelity.toml")
    pair = config.pairs[0]
    case = PairCase.run(FidelitySession(config=config), pair.a, pair.b, pair.margin, [0, 1, 2, 3])
    write_paired(root / "reports", case.payload)
    return root


def _edit_pair(doc: dict[str, Any], case: str) -> None:
    if case == "verdict":  # a verdict the interval and the margin do not give, whatever the genuine one is
        forged = "inconclusive" if doc["verdict"] == "equivalent" else "equivalent"
        doc["verdict"], doc["verdict_named"] = forged, forged
    elif case == "mean":
        doc["kld_mean"]["a"] *= 0.5
    elif case == "ci":
        doc["kld_mean"]["ci95"] = [-1e-6, 1e-6] if doc["kld_mean"]["ci95"] is not None else [0.0, 1.0]
    elif case == "margin":  # a wider margin that makes the pair "equivalent", every other field made consistent with it
        doc["margin"] = 10.0
        doc["verdict"], doc["verdict_named"] = "equivalent", "equivalent"
    elif case == "seed":
        doc["bootstrap"]["seed"] += 1
    elif case == "wins":
        doc["contexts"]["a_wins"] += 1
    elif case == "shards":
        doc["shards"] = [0, 9]


@pytest.mark.slow  # runs the pair of the tiny project once (module fixture) after the shared run
@pytest.mark.parametrize("case, pattern", [
    ("verdict", r"good-vs-bad\.json: verdict: expected '.*' \(from the interval and the margin\), found (equivalent|inconclusive)"),
    ("mean", r"good-vs-bad\.json: kld_mean\.a: expected [\d.e-]+ \(the shard reports of shards \[0, 1, 2, 3\]\), found"),
    ("ci", r"good-vs-bad\.json: (kld_mean\.ci95: expected .* \(re-derived from the shard reports\)|verdict: expected)"),
    ("margin", r"good-vs-bad\.json: margin: expected 0\.001 \(the pair's margin in the configuration\), found 10\.0"),
    ("seed", r"good-vs-bad\.json: bootstrap: expected seed 20240601, n_boot \d+ \(the configuration's\), found seed 20240602"),
    ("wins", r"good-vs-bad\.json: contexts: expected \{.*\} \(the shard reports' per-context means\), found"),
    ("shards", r"good-vs-bad\.json: shards: expected shards both good and bad have reports for \(\[0, 1, 2, 3\]\), found \[9\]"),
])
def test_publish_refuses_a_paired_report_that_does_not_follow_from_the_shard_reports(
        paired_run: Path, tmp_path: Path, case: str, pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A pair's headline (means, difference, its interval by the same cluster bootstrap, verdict under the
    configured margin, context wins) is re-derived from the two candidates' shard reports: a forged one is
    refused by name and nothing is published; the run's own passes."""
    from harness.cli.main import main
    from harness.inputs.config import load_config
    from harness.reports.report_set import _read_paired, load_reports

    root = tmp_path / "p"
    shutil.copytree(paired_run, root, symlinks=True)
    path = root / "reports" / "paired" / "good-vs-bad.json"
    groups, config = load_reports([root / "reports"]), load_config(root / "fidelity.toml")
    assert _read_paired(path, groups, config)["shards"] == [0, 1, 2, 3]  # the run's own passes
    doc = json.loads(path.read_text())
    _edit_pair(doc, case)
    path.write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=pattern):
        _read_paired(path, groups, config)
    assert main(["publish", "--reports", str(root / "reports"), "--config", str(root / "fidelity.toml"), "--out", str(tmp_path / "pub")]) == 1
    assert "good-vs-bad.json: " in capsys.readouterr().err and not (tmp_path / "pub").exists()


@pytest.mark.slow  # the pair's run (module fixture), publish and verify
def test_verify_refuses_resealed_results_with_an_edited_pair(paired_run: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli.main import main

    pub = tmp_path / "pub"
    assert main(["publish", "--reports", str(paired_run / "reports"), "--config", str(paired_run / "fidelity.toml"),
                 "--out", str(pub)]) == 0
    assert main(["verify", str(pub)]) == 0
    res = json.loads((pub / "results.json").read_text())
    assert [p["shards"] for p in res["paired"]] == [[0, 1, 2, 3]]
    res["paired"][0]["kld_mean"]["b"] *= 2
    assert "results.json: paired[0]: kld_mean.b: expected " in _resealed_verify_output(pub, res, capsys)


# ----------------------------------------------------------------------------- window.json re-derived by publish


@pytest.fixture(scope="module")
def window_run(tmp_path_factory: pytest.TempPathFactory, fidelity_run: Path) -> Path:
    """The tiny project's run plus its window comparison (windows 0 and 16 over the run's shards), computed as the
    window cases compute it (:meth:`WindowCase.run` on the session's positions) and written by the plugin's writer."""
    from harness.inputs.config import load_config
    from harness.plugin.kind_window import WindowCase
    from harness.reports.windows import write_window
    from harness.run.session import FidelitySession

    root = tmp_path_factory.mktemp("window") / "p"
    shutil.copytree(fidelity_run, root, symlinks=True)
    session = FidelitySession(config=load_config(root / "fidelity.toml"))
    write_window(root / "reports", [WindowCase.run(session, k, [0, 1, 2, 3]).payload for k in (0, 16)])
    return root


def _self_consistent(doc: dict[str, Any], edit: Any) -> dict[str, Any]:
    """``doc`` with its summaries edited by ``edit`` and every derived figure recomputed from them (a careful forgery)."""
    from harness.metrics.bootstrap import draw_cluster_weights, ratio_interval
    from harness.reports.windows import compare_windows

    by_window: dict[int, dict[str, Any]] = {}
    for key, w in doc["windows"].items():
        by_window[int(key)] = {c: {k: s[k] for k in ("score_from", "n_positions", "n_contexts", "mean_kld", "ci95", "clusters")}
                               for c, s in w["candidates"].items()}
    edit(by_window)
    for w in by_window.values():
        for s in w.values():
            cl = s["clusters"]
            sums, counts = np.asarray(cl["sum_kld"]), np.asarray(cl["positions"])
            s["mean_kld"] = float(sums.sum() / counts.sum())
            s["ci95"] = ratio_interval(draw_cluster_weights(len(counts), cl["n_boot"], cl["seed"]), sums, counts, bounds=(0.0, float("inf")))
    out = compare_windows(doc["base_window"], by_window)
    return {**out, "notes": doc["notes"], "shards": doc["shards"]}


@pytest.mark.slow  # the shared run, then the window comparison in-process
@pytest.mark.parametrize("case, pattern", [
    ("verdict", r"window\.json: verdict: expected 'ranking stable across windows' \(from the summaries\), found ranking CHANGES"),
    ("mean", r"window\.json: windows\.16\.candidates\.good\.mean_kld: expected [\d.e-]+ \(from its clusters\), found 0\.0"),
    ("seed", r"window\.json: windows\.0\.candidates\.bad\.clusters: expected seed 20240601, n_boot \d+, found seed 1, n_boot"),
    ("base", r"window\.json: windows\.0\.candidates\.good\.clusters: expected the shard reports' \(shards \[0, 1, 2, 3\]\), "
             r"found other clusters, positions or KLD sums"),
    ("later", r"window\.json: windows\.16\.candidates\.bad\.clusters: expected the base window's clusters less 16 positions a "
              r"context, and no more KLD, found other positions or more KLD"),
])
def test_publish_refuses_a_window_json_that_does_not_follow(window_run: Path, tmp_path: Path, case: str, pattern: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``window.json`` is checked against itself (every summary from its cluster sums, the verdict, rankings, flips
    and power recomputed) and its base window against the shard reports; a later window is bounded by the base
    (fewer positions, no more KLD). A careful forgery that recomputes every derived figure is still refused."""
    from harness.cli.main import main
    from harness.inputs.config import load_config
    from harness.reports.report_set import _read_window, load_reports

    root = tmp_path / "p"
    shutil.copytree(window_run, root, symlinks=True)
    path = root / "reports" / "window.json"
    groups, config = load_reports([root / "reports"]), load_config(root / "fidelity.toml")
    doc = _read_window(path, groups, config)  # the run's own passes
    assert doc["shards"] == [0, 1, 2, 3] and doc["verdict"] == "ranking stable across windows"
    if case == "verdict":
        doc["verdict"] = "ranking CHANGES with the window"
    elif case == "mean":
        doc["windows"]["16"]["candidates"]["good"]["mean_kld"] = 0.0
    elif case == "seed":
        doc["windows"]["0"]["candidates"]["bad"]["clusters"]["seed"] = 1
    elif case == "base":  # good's base-window KLD halved, everything derived recomputed to match
        doc = _self_consistent(doc, lambda bw: bw[0]["good"]["clusters"].update(
            sum_kld=[x * 0.5 for x in bw[0]["good"]["clusters"]["sum_kld"]]))
    elif case == "later":  # bad's KLD from row 16 on raised above its whole-context KLD, everything recomputed
        doc = _self_consistent(doc, lambda bw: bw[16]["bad"]["clusters"].update(
            sum_kld=[x * 10.0 for x in bw[0]["bad"]["clusters"]["sum_kld"]]))
    path.write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=pattern):
        _read_window(path, groups, config)
    assert main(["publish", "--reports", str(root / "reports"), "--config", str(root / "fidelity.toml"), "--out", str(tmp_path / "pub")]) == 1
    assert "window.json: " in capsys.readouterr().err and not (tmp_path / "pub").exists()


@pytest.mark.slow  # the window run (module fixture), publish and verify
def test_verify_refuses_resealed_results_with_an_edited_window(window_run: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli.main import main

    pub = tmp_path / "pub"
    assert main(["publish", "--reports", str(window_run / "reports"), "--config", str(window_run / "fidelity.toml"),
                 "--out", str(pub)]) == 0
    assert main(["verify", str(pub)]) == 0
    res = json.loads((pub / "results.json").read_text())
    res["window"]["windows"]["16"]["candidates"]["good"]["rel_change_mean_kld"] = 0.0
    assert "results.json: window: windows.16.candidates.good.rel_change_mean_kld: expected " in _resealed_verify_output(pub, res, capsys)
