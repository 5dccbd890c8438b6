"""Fidelity harness: exact full-vocabulary KL divergence of a quantized LLM against its BF16 original.

The library never imports pytest; ``harness.plugin.pytest_plugin`` is the thin adapter.
Imports flow one way: each folder has a rank and imports only its own folder and lower ranks
(docs/design.md, section 5, holds the table; tests/test_layout.py checks it).
"""

__version__ = "0.1.0"

#: Version of the measurement protocol (docs/design.md, section 2). Reports of different protocols never mix.
PROTOCOL_VERSION = 1
