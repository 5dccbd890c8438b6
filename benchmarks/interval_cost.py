"""What the mean interval costs: one shard report's intervals and one 842-cluster aggregate's, side by side with the
previous rule, in one run (docs/statistics.md, "What it costs").

Run by hand (seconds): ``python benchmarks/interval_cost.py``. A shard report calls
:func:`harness.metrics.bootstrap.ratio_intervals` on 16 clusters for 4 statistics (KLD, top-1, EAR, JSD) and 3
diagnostics; an aggregate of the seed suite on 842 clusters for 3 + 3; both with the default 10,000 draws. The
data are the fixture-fitted and heavy-tailed models of :mod:`harness.metrics.simulation`. Prints the median
wall time of 5 runs of each and the ratio now / previous rule.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from harness.metrics.bootstrap import DEFAULT_N_BOOT, draw_cluster_weights, ratio_intervals
from harness.metrics.simulation import FIXTURE, HEAVY, previous_rule_intervals


def _median_seconds(fn: Callable[[], object], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    print(f"machine: {platform.machine()}, {platform.system()}, numpy {np.__version__}")
    print("| data | clusters | statistics | now (s) | previous rule (s) | now / previous |")
    print("|---|---|---|---|---|---|")
    for model in (FIXTURE, HEAVY):
        for C, k, stats in ((16, 1, 7), (842, 6, 6)):
            sums, counts = model.draw(np.random.default_rng(C), stats, C, k)
            W = draw_cluster_weights(C, DEFAULT_N_BOOT, seed=1)
            now = _median_seconds(partial(ratio_intervals, W, sums, counts, bounds=(0.0, np.inf)))
            before = _median_seconds(partial(previous_rule_intervals, W, sums, counts))
            print(f"| {model.name} | {C} | {stats} | {now:.3f} | {before:.3f} | {now / before:.2f} |", flush=True)


if __name__ == "__main__":
    main()
