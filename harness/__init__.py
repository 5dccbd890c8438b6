"""Fidelity harness: exact full-vocabulary KL divergence of a quantized LLM against its BF16 original.

The library never imports pytest; ``harness.plugin.pytest_plugin`` is the thin adapter.
Data flows one way, and the folders follow it: ``inputs`` (config, suite, head) -> ``capture``
(engine registry, capture loop, store; engines in ``engines``) -> ``scoring`` -> ``metrics`` ->
``reports`` -> ``gate``; ``run`` ties one run together, ``plugin`` and ``cli`` are the front ends
(docs/design.md, section 5).
"""

__version__ = "0.1.0"

#: Version of the measurement protocol (docs/design.md, section 2). Reports of different protocols never mix.
PROTOCOL_VERSION = 1
