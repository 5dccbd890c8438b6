"""Project wiring only: the fidelity plugin itself is loaded through its ``pytest11`` entry point.

This repository's ``fidelity.toml`` (found from the rootdir) lists the embedded
default: the fixture model's BF16 reference and its quantized candidates.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The hybrid fixture's derived files (its head and two project-format candidates, not committed) exist
    and match the sha256 of fixtures/hybrid/rebuilt.json before any configuration is read: rebuilt from
    fixtures/hybrid/model by fixtures/make_hybrid.py when missing (~2 s)."""
    path = Path(__file__).resolve().parent / "fixtures" / "make_hybrid.py"
    spec = importlib.util.spec_from_file_location("make_hybrid", path)
    if spec is None or spec.loader is None:
        raise pytest.UsageError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.materialize()
    except RuntimeError as exc:
        raise pytest.UsageError(str(exc)) from None
