"""Per-candidate engine options (harness/engines/option_specs.py): validated, passed to the engine,
recorded in the capture's engine identity and therefore in every shard report; batched capture
(several contexts per engine call) stores the same rows as one at a time, within a measured bound."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.engines.base import EngineOptions
from harness.engines.option_specs import validate_options
from harness.engines.registry import BUILTIN, engines, get_engine
from harness.errors import FidelityError, MissingPackageError
from harness.inputs.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]

EXPECTED = {
    "transformers": {"device_map", "max_memory", "attn_implementation", "batch_size"},
    "llamacpp": {"n_gpu_layers", "flash_attn", "n_batch", "n_ubatch", "threads"},
    "vllm": {"tensor_parallel_size", "gpu_memory_utilization", "max_num_batched_tokens", "enforce_eager",
             "kv_cache_dtype", "batch_size"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_engine_declares_its_options_and_refuses_unknown_ones(name: str) -> None:
    eng = get_engine(name)
    assert set(eng.options) == EXPECTED[name]
    with pytest.raises(FidelityError) as e:
        validate_options(name, eng.options, {"n_gpu_layer": 3})
    msg = str(e.value)
    assert f"engine {name!r} has no option 'n_gpu_layer'" in msg
    assert all(opt in msg for opt in EXPECTED[name])  # names the engine's options


def test_every_builtin_engine_has_an_option_table() -> None:
    assert {e.name for e in BUILTIN} == set(EXPECTED) and set(EXPECTED) <= set(engines())


@pytest.mark.parametrize(
    "engine, raw, expect",
    [
        ("llamacpp", {"n_gpu_layers": "all"}, "expected an integer, found 'all'"),
        ("llamacpp", {"n_gpu_layers": -2}, "expected a value in [-1, 100000], found -2"),
        ("llamacpp", {"flash_attn": 1}, "expected true or false, found 1"),
        ("llamacpp", {"threads": True}, "expected an integer, found True"),
        ("vllm", {"gpu_memory_utilization": 1.5}, "expected a value in [0.01, 1], found 1.5"),
        ("vllm", {"kv_cache_dtype": "int4"}, "expected one of auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, found 'int4'"),
        ("vllm", {"tensor_parallel_size": 0}, "expected a value in [1, 1024], found 0"),
        ("transformers", {"attn_implementation": "fast"}, "expected one of eager, sdpa"),
        ("transformers", {"max_memory": "20GiB"}, "expected a table, found str"),
        ("transformers", {"device_map": 0}, "expected a string or a table, found 0"),
        ("transformers", {"max_memory": {"cpu": [1]}}, "max_memory.cpu: expected a string or a finite number"),
    ],
)
def test_wrong_values_name_the_option_and_what_was_expected(engine: str, raw: dict[str, object], expect: str) -> None:
    with pytest.raises(FidelityError) as e:
        validate_options(engine, get_engine(engine).options, raw)
    assert expect in str(e.value)


def test_valid_options_come_back_sorted_and_typed() -> None:
    got = validate_options("vllm", get_engine("vllm").options,
                           {"gpu_memory_utilization": 1, "enforce_eager": False, "tensor_parallel_size": 2})
    assert list(got) == ["enforce_eager", "gpu_memory_utilization", "tensor_parallel_size"]
    assert got["gpu_memory_utilization"] == 1.0 and isinstance(got["gpu_memory_utilization"], float)


def _project_with(fidelity_project: Path, tmp_path: Path, extra: str) -> Path:
    root = tmp_path / "p"
    shutil.copytree(fidelity_project, root)
    text = (root / "fidelity.toml").read_text("utf-8")
    text = text.replace('name = "good"\nmodel = "models/good"\ntags = ["noise-0.02"]\n',
                        'name = "good"\nmodel = "models/good"\ntags = ["noise-0.02"]\n' + extra)
    (root / "fidelity.toml").write_text(text, "utf-8")
    return root


def test_config_reads_validates_and_refuses_options(fidelity_project: Path, tmp_path: Path) -> None:
    root = _project_with(fidelity_project, tmp_path, '[candidates.options]\nbatch_size = 3\nattn_implementation = "eager"\n')
    cfg = load_config(root / "fidelity.toml")
    assert cfg.candidate("good").options == {"attn_implementation": "eager", "batch_size": 3}
    assert cfg.candidate("bad").options == {}
    bad = _project_with(fidelity_project, tmp_path / "b", "[candidates.options]\nn_gpu_layers = 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad / "fidelity.toml")
    assert "candidates[0].options of 'good'" in str(e.value) and "attn_implementation (str)" in str(e.value)


def test_options_of_a_stored_capture_are_refused(fidelity_project: Path, tmp_path: Path) -> None:
    root = tmp_path / "p"
    shutil.copytree(fidelity_project, root)
    text = (root / "fidelity.toml").read_text("utf-8").replace('model = "models/good"', 'store = "reference"')
    (root / "fidelity.toml").write_text(text.replace('tags = ["noise-0.02"]\n', 'tags = ["noise-0.02"]\n[candidates.options]\nbatch_size = 2\n', 1), "utf-8")
    with pytest.raises(ConfigError, match="options configure an engine running a live model"):
        load_config(root / "fidelity.toml")


def test_transformers_options_are_passed_recorded_and_batching_keeps_the_rows(fidelity_project: Path, tmp_path: Path) -> None:
    """One context per forward vs three per forward (and an explicit device_map): both stores record
    their options, and the stored rows agree to a bf16 rounding step (measured here: identical)."""
    pytest.importorskip("accelerate", reason="the accelerate extra is not installed (device_map)")
    from harness.capture.loop import capture

    model, suite = fidelity_project / "models" / "good", fidelity_project / "suite"
    one = capture("transformers", model, suite, tmp_path / "one", progress=False)
    opts = {"batch_size": 3, "device_map": "cpu"}
    many = capture("transformers", model, suite, tmp_path / "many", progress=False, options=EngineOptions(engine_options=opts))
    assert "options" not in one.manifest["engine"]  # defaults: the identity every existing store has
    assert json.loads(many.manifest["engine"]["options"]) == opts
    assert one.indices == many.indices == list(range(8))
    for i in one.indices:
        a, b = one.load(i).double().numpy(), many.load(i).double().numpy()
        assert np.max(np.abs(a - b)) <= 2.0**-8 * np.max(np.abs(a)), i  # other GEMM shapes: at most bf16 rounding


def test_attn_implementation_reaches_the_model(fidelity_project: Path) -> None:
    from harness.engines.transformers import load_model

    for impl in ("eager", "sdpa"):
        m = load_model(fidelity_project / "models" / "good", options={"attn_implementation": impl})
        assert m.config._attn_implementation == impl


def test_max_memory_needs_device_map(fidelity_project: Path) -> None:
    from harness.engines.transformers import load_model

    with pytest.raises(FidelityError, match="'max_memory' needs 'device_map'"):
        load_model(fidelity_project / "models" / "good", options={"max_memory": {"cpu": "1GiB"}})


def test_device_map_without_accelerate_names_the_extra(fidelity_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate is an extra: without it, device_map is one line naming the install command."""
    import sys

    from harness.engines.transformers import load_model

    monkeypatch.setitem(sys.modules, "accelerate", None)  # find_spec / import now see no accelerate
    with pytest.raises(MissingPackageError, match=r"'device_map': accelerate is not installed: pip install 'fidelity-harness\[accelerate\]'"):
        load_model(fidelity_project / "models" / "good", options={"device_map": "auto"})


def test_device_map_auto_with_max_memory_loads_on_the_cpu(fidelity_project: Path, tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="the accelerate extra is not installed (device_map)")
    from harness.capture.loop import capture

    opts = {"device_map": "auto", "max_memory": {"cpu": "2GiB"}}
    store = capture("transformers", fidelity_project / "models" / "good", fidelity_project / "suite", tmp_path / "s",
                    shards=[0], progress=False, options=EngineOptions(engine_options=opts))
    assert json.loads(store.manifest["engine"]["options"]) == opts
    assert store.manifest["device"] == "cpu"


def test_shard_report_records_the_candidates_options(fidelity_project: Path, tmp_path: Path) -> None:
    """A live candidate with options runs through the pytest session; its shard report's engine block has them."""
    from harness.run.session import FidelitySession

    root = _project_with(fidelity_project, tmp_path, '[candidates.options]\nbatch_size = 2\nattn_implementation = "sdpa"\n')
    session = FidelitySession(load_config(root / "fidelity.toml"))
    cand = session.config.candidate("good")
    scored = session.score(cand, 0, n_boot=50)
    engine = json.loads(json.dumps(scored.report.to_json_dict()))["comparability"]["engine"]  # as written to disk
    assert json.loads(engine["candidate"]["options"]) == {"attn_implementation": "sdpa", "batch_size": 2}
    assert "options" not in engine["reference"]
    assert session.live_store_path(cand) != FidelitySession(load_config(fidelity_project / "fidelity.toml")).live_store_path(
        load_config(fidelity_project / "fidelity.toml").candidate("good"))  # other options: another cache folder


def test_llamacpp_options_reach_llama_cpp_and_the_store(tmp_path: Path) -> None:
    """flash attention, batch sizes and threads through llama.cpp: the store records them, and the
    logits stay within a small distance of the defaults' (flash attention reorders the sums)."""
    from harness.engines.llamacpp import INSTALL_HINT, available

    if not available():
        pytest.skip(f"llama-cpp-python is not installed (install: {INSTALL_HINT})")
    from harness.capture.loop import capture

    gguf, suite = ROOT / "fixtures" / "gguf" / "fixture-q8_0.gguf", ROOT / "fixtures" / "suite"
    if not gguf.is_file():
        pytest.skip(f"{gguf} missing (make it with fixtures/make_gguf.py)")
    base = capture("llamacpp", gguf, suite, tmp_path / "base", shards=[0], progress=False, options=EngineOptions(threads=1))
    opts = {"flash_attn": True, "n_batch": 128, "n_ubatch": 64, "threads": 1, "n_gpu_layers": 0}
    other = capture("llamacpp", gguf, suite, tmp_path / "opts", shards=[0], progress=False,
                    options=EngineOptions(engine_options=opts))
    ident = other.manifest["engine"]
    assert json.loads(ident["options"]) == opts
    assert ident["flash_attn"] == "on" and ident["batch"] == "n_batch 128, n_ubatch 64"
    assert base.manifest["engine"]["flash_attn"] == "off" and "options" not in base.manifest["engine"]
    for i in base.indices[:4]:
        a, b = base.load(i).double().numpy(), other.load(i).double().numpy()
        assert np.max(np.abs(a - b)) < 0.05 * np.max(np.abs(a))  # same weights, other kernels and batches
    with pytest.raises(FidelityError, match="n_ubatch .* may not exceed n_batch"):
        capture("llamacpp", gguf, suite, tmp_path / "bad", shards=[0], progress=False,
                options=EngineOptions(engine_options={"n_batch": 32, "n_ubatch": 64}))


@pytest.mark.slow
def test_vllm_batched_capture_with_options_records_them(tmp_path: Path) -> None:
    """Several contexts per vLLM encode call, with explicit options: recorded, rows equal to one at a
    time within a bf16 rounding step (measured on this CPU: identical)."""
    from harness.engines.vllm import INSTALL_HINT, available

    if not available():
        pytest.skip(f"vllm is not installed (install: {INSTALL_HINT})")
    from harness.capture.loop import capture

    model, suite = ROOT / "fixtures" / "model", ROOT / "fixtures" / "suite"
    one = capture("vllm", model, suite, tmp_path / "one", shards=[0], progress=False)
    opts = {"batch_size": 8, "enforce_eager": True, "kv_cache_dtype": "auto", "max_num_batched_tokens": 4096}
    many = capture("vllm", model, suite, tmp_path / "many", shards=[0], progress=False,
                   options=EngineOptions(engine_options=opts))
    assert json.loads(many.manifest["engine"]["options"]) == opts and "options" not in one.manifest["engine"]
    for i in one.indices:
        a, b = one.load(i).double().numpy(), many.load(i).double().numpy()
        assert np.max(np.abs(a - b)) <= 2.0**-8 * np.max(np.abs(a)), i
