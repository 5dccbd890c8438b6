"""pytest plugin: thin adapter over the harness library (options, markers, parametrization, fixtures).

Being filled in by the pytest-harness issue; for now it only registers the markers.
"""

from __future__ import annotations

import pytest

MARKERS = {
    "fidelity": "a candidate x shard fidelity case",
    "tails": "tail reports (percentiles, CVaR, exceedances)",
    "window": "scoring-window controls",
    "paired": "paired comparisons of two candidates",
    "cross_engine": "cross-engine floor (same weights, two engines)",
    "gpu": "needs a CUDA device",
    "slow": "slow test",
    "benchmark": "performance benchmark (pytest-benchmark); skipped unless --fidelity-benchmarks",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
