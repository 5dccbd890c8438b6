"""Foreign dataset layouts, read in place and written (docs/design.md, section 3, "Interchange layouts").

The published fidelity datasets (a suite manifest with one JSON token file per context, shard views,
``hidden_NNNN.safetensors`` capture folders with ``capture-manifest.json``, a single-tensor shared head
and ``qwen38-fidelity-report/1..3`` reports) are read here without being rewritten: every file is
verified against the dataset's own published digests, which are kept as the custody record of every
report scored against it. The same layout is written from this project's suite, reference, captures
and reports. The folder sits above ``reports`` and below ``run``.
"""
