"""Project wiring only: the fidelity plugin itself is loaded through its ``pytest11`` entry point.

This repository's ``fidelity.toml`` (found from the rootdir) lists the embedded
default: the fixture model's BF16 reference and its quantized candidates.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent
#: The mixture-of-experts configuration and the module with its float64 check (run with it, never alone).
MOE_CONFIG = ROOT / "fidelity-moe.toml"
MOE_CHECKS = ROOT / "fidelity_tests" / "check_moe_float64.py"
#: The hybrid's configuration: its run collects the same float64 check (int4_g32 x shard 0 of the configuration in use).
HYBRID_CONFIG = ROOT / "fidelity-hybrid.toml"

# Benchmark scripts are run by hand (``python benchmarks/bench_scorer.py``), not collected.
collect_ignore = ["benchmarks", "fixtures"]

# pytester drives the plugin's own tests (tests/test_plugin.py).
pytest_plugins = ["pytester"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ladders (the cases the plugin collects from fidelity.toml / fidelity-gguf.toml, and the
    cross-engine floor) belong to the slow tier of this repository: ``pytest -m "not slow"`` is the
    quick run of the harness's own tests."""
    ladder = ("fidelity", "fidelity_tails", "fidelity_window", "fidelity_paired", "fidelity_cross_engine")
    for item in items:
        if any(item.get_closest_marker(m) for m in ladder):
            item.add_marker(pytest.mark.slow)


def _in_use(config: pytest.Config, toml: Path) -> bool:
    """True when this run collects the cases of ``toml`` (given as an argument or as --fidelity-config)."""
    given = [config.getoption("fidelity_config", None), *config.args]
    return any(Path(str(a).split("::")[0]).resolve() == toml for a in given if a)


def _fixture_builder(name: str) -> ModuleType:
    """The module ``fixtures/<name>.py`` (fixture builders are scripts, not a package)."""
    path = ROOT / "fixtures" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise pytest.UsageError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Derived fixture files exist and match their manifests before any configuration is read:
    the hybrid's (its head and project-format candidates, fixtures/hybrid/rebuilt.json; ~2 s) always, and,
    when fidelity-moe.toml is in use, the MoE's (its head and three project-format candidates,
    fixtures/moe/rebuilt.json; seconds). Each is rebuilt from its committed model when missing."""
    try:
        _fixture_builder("make_hybrid").materialize()
        if _in_use(config, MOE_CONFIG):
            _fixture_builder("make_moe_candidates").ensure()
    except RuntimeError as exc:
        raise pytest.UsageError(str(exc)) from None


class _ConfigChecks(pytest.Module):
    """The tests of a module run as part of a configuration's cases: the node is the configuration file (so
    ``pytest fidelity-moe.toml`` selects it), its object the module ``checks`` names."""

    checks: Path = MOE_CHECKS

    def _getobj(self) -> object:
        spec = importlib.util.spec_from_file_location(f"fidelity_checks_{self.checks.stem}", self.checks)
        if spec is None or spec.loader is None:
            raise pytest.UsageError(f"{self.checks}: cannot be imported")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """``pytest fidelity-moe.toml`` and ``pytest fidelity-hybrid.toml`` also run the float64 check of their
    int4_g32 x shard 0 (fidelity_tests/check_moe_float64.py)."""
    if file_path.resolve() in (MOE_CONFIG, HYBRID_CONFIG):
        return _ConfigChecks.from_parent(parent, path=file_path)
    return None
