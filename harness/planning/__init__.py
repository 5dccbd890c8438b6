"""How much suite a verdict needs (``fidelity plan``): the cluster design's precision and power."""
