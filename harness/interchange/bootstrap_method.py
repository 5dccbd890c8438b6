"""The published tool's interval: a percentile source-cluster bootstrap over context means.

Its rule, implemented here from its description: group the per-context means by source cluster,
the clusters kept in order of first appearance; with ``random.Random(seed)`` draw, per replicate,
as many clusters as there are (``randrange(n_clusters)`` once per slot, with replacement); the
replicate is the mean of every context mean in the drawn clusters (each context weighs one); sort
the replicates; the interval is ``[means[int(0.025 n)], means[int(0.975 n) - 1]]``. This is a
percentile interval of the context-macro mean, not this project's studentized interval of the
token mean; it is reproduced so a published number can be checked, never used for a verdict.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

#: Defaults of the published tool.
SAMPLES = 10_000
SEED = 1


def percentile_bootstrap(values: Sequence[float], clusters: Sequence[Any], samples: int = SAMPLES,
                         seed: int = SEED) -> dict[str, Any]:
    """``{"mean", "ci95_low", "ci95_high", "clusters", "samples"}`` as the published tool reports it."""
    if len(values) != len(clusters) or not values:
        raise ValueError(f"percentile_bootstrap: {len(values)} values for {len(clusters)} clusters")
    groups: dict[Any, list[float]] = {}
    for v, c in zip(values, clusters):
        groups.setdefault(c, []).append(float(v))
    keys = list(groups)
    sums = [math.fsum(groups[k]) for k in keys]
    counts = [len(groups[k]) for k in keys]
    rng = random.Random(seed)
    n = len(keys)
    means = []
    for _ in range(samples):
        picked = [rng.randrange(n) for _ in range(n)]
        means.append(math.fsum(sums[j] for j in picked) / sum(counts[j] for j in picked))
    means.sort()
    return {"mean": statistics.fmean(values), "ci95_low": means[int(0.025 * samples)],
            "ci95_high": means[int(0.975 * samples) - 1], "clusters": n, "samples": samples}
