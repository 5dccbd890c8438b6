"""Project wiring only: the fidelity plugin itself is loaded through its ``pytest11`` entry point.

This repository's ``fidelity.toml`` (found from the rootdir) lists the embedded
default: the fixture model's BF16 reference and its quantized candidates.
"""

from __future__ import annotations

# Benchmark scripts are run by hand (``python benchmarks/bench_scorer.py``), not collected.
collect_ignore = ["benchmarks", "fixtures"]

# pytester drives the plugin's own tests (tests/test_plugin.py).
pytest_plugins = ["pytester"]
