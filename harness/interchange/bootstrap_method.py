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

import numpy as np

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
    n = len(keys)
    picks = _randrange_draws(seed, n, samples * n).reshape(samples, n)
    total = np.asarray(sums, dtype=np.float64)
    size = np.asarray(counts, dtype=np.int64)[picks].sum(axis=1)
    # math.fsum is exactly rounded (its result does not depend on the order of its terms): each replicate's mean
    # is bit for bit the published tool's per-slot sum over the drawn clusters
    means = [math.fsum(total[row].tolist()) / int(c) for row, c in zip(picks, size)]
    means.sort()
    return {"mean": statistics.fmean(values), "ci95_low": means[int(0.025 * samples)],
            "ci95_high": means[int(0.975 * samples) - 1], "clusters": n, "samples": samples}


def _randrange_draws(seed: int, n: int, count: int) -> np.ndarray:
    """The first ``count`` values of ``random.Random(seed).randrange(n)`` called ``count`` times, drawn in numpy.

    CPython's ``randrange(n)`` takes ``k = n.bit_length()`` bits (the top ``k`` of one 32-bit Mersenne Twister
    output, ``k`` <= 32) and draws again while the value is ``>= n``; numpy's MT19937 given the same state yields the
    same 32-bit outputs, so the accepted values are the same sequence (the published tool's 10,000 x 842 draws:
    ~0.5 s instead of ~20 s of Python calls). The first draws are checked against ``random.Random`` itself; where
    they differ (another ``randrange``), every value is drawn by it."""
    rng = random.Random(seed)
    k = n.bit_length()
    if k > 32:
        return np.fromiter((rng.randrange(n) for _ in range(count)), dtype=np.int64, count=count)
    _, state, _ = rng.getstate()
    bits = np.random.MT19937()
    bits.state = {"bit_generator": "MT19937", "state": {"key": np.asarray(state[:624], dtype=np.uint32), "pos": state[624]}}
    parts: list[np.ndarray] = []
    have = 0
    while have < count:
        words = bits.random_raw(max(1024, int((count - have) * (1 << k) / n * 1.02) + 64)) >> (32 - k)
        kept = words[words < n].astype(np.int64)
        parts.append(kept)
        have += len(kept)
    out: np.ndarray = np.concatenate(parts)[:count]
    check = min(count, 2 * n)
    if [rng.randrange(n) for _ in range(check)] != out[:check].tolist():
        rng = random.Random(seed)
        return np.fromiter((rng.randrange(n) for _ in range(count)), dtype=np.int64, count=count)
    return out
