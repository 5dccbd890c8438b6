"""An engine from outside this repository: a small package, built and pip-installed into a temporary folder
at test time, declares an engine in the ``fidelity.engines`` entry-point group; the registry finds it and a
``fidelity.toml`` candidate served by it runs its candidate x shard case like a built-in one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: The out-of-tree engine: its own transformers loading and its own hook at the LM head's input (no harness
#: engine code), satisfying harness.engines.base.Engine.
_ENGINE = '''
"""A toy engine for the fidelity harness, installed from outside its repository."""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from harness.engines.identity import model_identity


class _Loaded:
    def __init__(self, model):
        self.model = model
        self.hidden_size = model.config.hidden_size
        self.vocab_size = model.config.vocab_size
        self.device = "cpu"

    def identity(self):
        return {"name": "toy", "version": "0.1"}

    def forward(self, token_ids, kind):
        grabbed = []
        head = self.model.get_output_embeddings()
        handle = head.register_forward_pre_hook(lambda _m, args: grabbed.append(args[0].detach()))
        try:
            with torch.inference_mode():
                self.model(input_ids=torch.as_tensor(token_ids, dtype=torch.long)[None], use_cache=False)
        finally:
            handle.remove()
        return grabbed[0][0, :-1].to(torch.bfloat16).contiguous()

    def close(self):
        self.model = None


class ToyEngine:
    name = "toy"
    kinds = ("hidden_states",)
    install_hint = "pip install fidelity-toy-engine"

    def available(self):
        return True

    def model_identity(self, model):
        return model_identity(model)

    def load(self, model, n_ctx, kind, options):
        m = AutoModelForCausalLM.from_pretrained(Path(model), dtype=torch.bfloat16, use_safetensors=True)
        return _Loaded(m.eval())


ENGINE = ToyEngine()
'''

_PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "fidelity-toy-engine"
version = "0.1"

[project.entry-points."fidelity.engines"]
toy = "fidelity_toy_engine:ENGINE"
'''


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy engine package, pip-installed (with its entry point) into a folder of its own."""
    src = tmp_path_factory.mktemp("toy-src")
    (src / "pyproject.toml").write_text(_PYPROJECT)
    (src / "fidelity_toy_engine").mkdir()
    (src / "fidelity_toy_engine" / "__init__.py").write_text(_ENGINE)
    site = tmp_path_factory.mktemp("toy-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(src)], check=True, capture_output=True, text=True)
    assert list(site.glob("fidelity_toy_engine-0.1.dist-info/entry_points.txt"))
    return site


def _registry_names(site: Path) -> list[str]:
    code = "from harness.engines.registry import engine_names; print(','.join(engine_names()))"
    env_path = f"{site}:{Path(__file__).resolve().parents[1]}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_path, "HOME": str(site)})
    return out.stdout.strip().split(",")


@pytest.mark.slow  # builds and installs a package, then runs two candidate x shard cases
def test_an_installed_engine_package_runs_a_candidate_case(toy_site: Path, pytester: pytest.Pytester,
                                                          fidelity_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _registry_names(toy_site) == ["transformers", "llamacpp", "toy", "vllm"]
    shutil.copytree(fidelity_project, pytester.path, dirs_exist_ok=True)
    toml = pytester.path / "fidelity.toml"
    toml.write_text(toml.read_text("utf-8") + textwrap.dedent('''
        [[candidates]]
        name = "good_toy"
        engine = "toy"
        model = "models/good"
    '''), "utf-8")
    monkeypatch.setenv("PYTHONPATH", f"{toy_site}:{Path(__file__).resolve().parents[1]}")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "fidelity", "--fidelity-shards", "0",
                                           "--fidelity-candidates", "good,good_toy", "--fidelity-update-baselines")
    result.assert_outcomes(passed=2)
    toy = json.loads((pytester.path / "fidelity-reports" / "good_toy" / "shard-00.json").read_text())
    builtin = json.loads((pytester.path / "fidelity-reports" / "good" / "shard-00.json").read_text())
    assert toy["comparability"]["engine"]["candidate"] == {"name": "toy", "version": "0.1"}
    # the same weights at the same capture point: the toy engine measures what the built-in engine measures
    assert toy["comparability"]["candidate"]["identity"] == builtin["comparability"]["candidate"]["identity"]
    assert toy["metrics"]["kld"]["mean"] == pytest.approx(builtin["metrics"]["kld"]["mean"], rel=1e-6, abs=1e-12)
    assert toy["metrics"]["kld"]["mean"] > 0


def test_a_broken_entry_point_is_named(tmp_path: Path) -> None:
    """An entry point whose object lacks the Engine members is refused naming the entry point and the member."""
    site = tmp_path / "site"
    dist = site / "broken_engine-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-engine\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[fidelity.engines]\nbroken = broken_engine:ENGINE\n")
    (site / "broken_engine.py").write_text("class E:\n    name = 'broken'\n\nENGINE = E()\n")
    code = "from harness.engines.registry import engines; engines()"
    env_path = f"{site}:{Path(__file__).resolve().parents[1]}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_path, "HOME": str(tmp_path)})
    assert out.returncode != 0
    assert "entry point 'broken' = 'broken_engine:ENGINE' (group fidelity.engines, distribution broken-engine)" in out.stderr
    assert "found one lacking kinds, install_hint, available, model_identity, load" in out.stderr
