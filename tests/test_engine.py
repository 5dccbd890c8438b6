"""The engine registry, the shared capture loop's refusals, and loading that cannot lie."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from harness.errors import FidelityError

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "fixtures" / "model"


def test_registry_finds_every_engine_module() -> None:
    from harness.engines.registry import engine_names, get_engine

    names = engine_names()
    assert names[0] == "transformers"
    assert "llamacpp" in names
    assert get_engine("llamacpp").kinds[0] == "logits"
    with pytest.raises(FidelityError, match="expected one of transformers.*found 'llamacp'.*did you mean 'llamacpp'"):
        get_engine("llamacp")


def test_config_refuses_an_unregistered_engine(tmp_path: Path) -> None:
    from harness.inputs.config import ConfigError, load_config

    cfg = tmp_path / "fidelity.toml"
    cfg.write_text('[suite]\npath = "s"\n[reference]\nstore = "r"\nhead = "h"\n'
                   '[[candidates]]\nname = "x"\nengine = "transformer"\nmodel = "m"\n')
    with pytest.raises(ConfigError, match=r"candidates\[0\]\.engine: expected one of .*found 'transformer'.*did you mean 'transformers'"):
        load_config(cfg)


def test_loop_refuses_a_kind_the_engine_lacks(tmp_path: Path) -> None:
    from harness.capture.loop import capture

    with pytest.raises(FidelityError, match="cannot capture kind 'probs'"):
        capture("transformers", MODEL, ROOT / "fixtures" / "suite", tmp_path / "out", kind="probs")
    assert not (tmp_path / "out").exists()


def _copy_model(tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(MODEL, dst)
    return dst


def test_missing_and_unexpected_keys_are_refused(tmp_path: Path) -> None:
    """A checkpoint transformers cannot fully interpret would load with random weights: refused."""
    from safetensors.torch import load_file, save_file

    from harness.engines.transformers import load_model

    model = _copy_model(tmp_path)
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    tensors["model.layers.0.mlp.down_proj.qweight"] = tensors.pop(name)  # a format transformers does not know
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(FidelityError, match=rf"missing_keys: {name}.*unexpected_keys: model.layers.0.mlp.down_proj.qweight"):
        load_model(model)


def test_unmodified_fixture_loads_without_refusal() -> None:
    from harness.engines.transformers import load_model

    model = load_model(MODEL)
    assert model.get_output_embeddings().weight.shape[0] == 4096


@pytest.mark.parametrize(("method", "package"), [("hqq", "hqq"), ("quanto", "optimum-quanto"), ("aqlm", "aqlm")])
def test_missing_quantization_package_is_a_named_error(tmp_path: Path, method: str, package: str) -> None:
    from harness.engines.transformers import QUANT_PACKAGES, load_model

    module = QUANT_PACKAGES[method][0]
    try:
        present = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        present = False
    if present:
        pytest.skip(f"{module} is installed here")
    model = _copy_model(tmp_path)
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": method}
    (model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FidelityError, match=rf"config.json: quantization_config.quant_method '{method}': \S+ is not "
                                            rf"installed: pip install {package}$"):
        load_model(model)


def test_remote_code_is_never_run_unless_asked(tmp_path: Path) -> None:
    """A folder whose config points at its own Python code: without trust_remote_code it is refused and the
    code never runs."""
    from harness.engines.transformers import load_model

    model = _copy_model(tmp_path)
    marker = tmp_path / "ran"
    (model / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    cfg = json.loads((model / "config.json").read_text())
    cfg["model_type"] = "evil"
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FidelityError):
        load_model(model)
    assert not marker.exists()


def test_no_pickle_or_yaml_load_in_the_harness() -> None:
    """Checked on the source: no torch.load, pickle, yaml.load/unsafe_load, and np.load only with
    allow_pickle=False."""
    import ast

    bad = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                bad += [f"{path}: import {m}" for m in mods if m.split(".")[0] in ("pickle", "dill", "cloudpickle", "yaml")]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
                if (owner, node.func.attr) in (("torch", "load"), ("yaml", "load"), ("yaml", "unsafe_load")):
                    bad.append(f"{path}:{node.lineno}: {owner}.{node.func.attr}")
                if (owner, node.func.attr) == ("np", "load"):
                    kws = {k.arg: k.value for k in node.keywords}
                    if not (isinstance(kws.get("allow_pickle"), ast.Constant) and kws["allow_pickle"].value is False):
                        bad.append(f"{path}:{node.lineno}: np.load without allow_pickle=False")
    assert not bad, bad
