"""Per-side miss rates of the harness's 95 % mean-KLD interval (the table in docs/statistics.md).

Run by hand (minutes): ``python benchmarks/coverage_table.py [reps] [models]``. For each synthetic model of
:mod:`harness.metrics.simulation` (plus two heavier lognormal shapes) and each cluster count the harness gates on,
``reps`` data sets are drawn and the production function :func:`harness.metrics.bootstrap.ratio_intervals`
(10,000 replicates, as every shard report draws) gives each one's interval, and the previous rule
(:func:`harness.metrics.simulation.previous_rule_intervals`) on the same data sets and draws; the table prints
how often the upper end falls below the true mean and the lower end above it, with the Monte-Carlo standard
error, and the median width relative to the percentile interval's.
"""

from __future__ import annotations

import sys

import numpy as np
from coverage_unseen import rate  # run as a script: benchmarks/ is on the path

from harness.metrics.bootstrap import DEFAULT_N_BOOT, draw_cluster_weights, ratio_intervals
from harness.metrics.simulation import ALL_MODELS, LAYOUTS, ClusterModel, previous_rule_intervals

HEAVIER = (
    ClusterModel("lognormal 0.8 / 0.3 / 1.5", sigma_cluster=0.8, sigma_context=0.3, sigma_position=1.5),
    ClusterModel("lognormal 1.0 / 0.2 / 2.0", sigma_cluster=1.0, sigma_context=0.2, sigma_position=2.0),
)


def main(reps: int = 4000, models: str = "") -> None:
    """The table with ``reps`` data sets per cell (half from 100 clusters), for the models whose name contains one
    of the comma-separated ``models`` (all when empty)."""
    print("| model | clusters | data sets | upper end below the truth: before | now | lower end above: before | now "
          "| width / percentile interval's: before / now |")
    print("|---|---|---|---|---|---|---|---|")
    for model in ALL_MODELS[:2] + HEAVIER + ALL_MODELS[2:]:
        if models and not any(m in model.name for m in models.split(",")):
            continue
        for C, k in LAYOUTS:
            n = reps if C < 100 else reps // 2
            rng = np.random.default_rng(7000 + C)
            W = draw_cluster_weights(C, DEFAULT_N_BOOT, seed=C + 1)
            miss = np.zeros(4)
            widths: list[list[np.ndarray]] = [[], []]
            for r0 in range(0, n, 100):
                sums, counts = model.draw(rng, min(100, n - r0), C, k)
                before, pct = previous_rule_intervals(W, sums, counts)
                iv = np.array(ratio_intervals(W, sums, counts, bounds=(0.0, np.inf)), dtype=np.float64)
                miss += [(before[:, 1] < model.mean).sum(), (iv[:, 1] < model.mean).sum(),
                         (before[:, 0] > model.mean).sum(), (iv[:, 0] > model.mean).sum()]
                for j, x in enumerate((before, iv)):
                    widths[j].append((x[:, 1] - x[:, 0]) / (pct[:, 1] - pct[:, 0]))
            cols = [rate(float(x) / n, n) for x in miss]
            wb, wn = (float(np.median(np.concatenate(w))) for w in widths)
            print(f"| {model.name} | {C} | {n} | {' | '.join(cols)} | {wb:.2f} / {wn:.2f} |", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000, sys.argv[2] if len(sys.argv) > 2 else "")
