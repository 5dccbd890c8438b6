"""Per-side miss rates of the harness's 95 % mean-KLD interval (the table in docs/statistics.md).

Run by hand (minutes): ``python benchmarks/coverage_table.py [reps] [models]``. For each synthetic model of
:mod:`harness.metrics.simulation` (plus two heavier lognormal shapes) and each cluster count the
harness gates on, ``reps`` data sets are drawn and the production function
:func:`harness.metrics.bootstrap.ratio_intervals` (2,000 replicates) gives each one's interval; the
table prints how often the upper end falls below the true mean and the lower end above it, with
the Monte-Carlo standard error, and the median half-widths relative to the mean.
"""

from __future__ import annotations

import sys

import numpy as np
from coverage_unseen import BEFORE, calibration, rate  # run as a script: benchmarks/ is on the path

from harness.metrics.bootstrap import draw_cluster_weights, ratio_intervals
from harness.metrics.simulation import ALL_MODELS, LAYOUTS, ClusterModel

HEAVIER = (
    ClusterModel("lognormal 0.8 / 0.3 / 1.5", sigma_cluster=0.8, sigma_context=0.3, sigma_position=1.5),
    ClusterModel("lognormal 1.0 / 0.2 / 2.0", sigma_cluster=1.0, sigma_context=0.2, sigma_position=2.0),
)


def main(reps: int = 4000, models: str = "") -> None:
    """The table with ``reps`` data sets per cell (half from 100 clusters), for the models whose name contains one
    of the comma-separated ``models`` (all when empty)."""
    print("| model | clusters | data sets | upper end below the truth: before | now | lower end above: before | now "
          "| upper half-width / mean: before / now | lower: now |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in ALL_MODELS[:2] + HEAVIER + ALL_MODELS[2:]:
        if models and not any(m in model.name for m in models.split(",")):
            continue
        for C, k in LAYOUTS:
            n = reps if C < 100 else reps // 2
            rng = np.random.default_rng(7000 + C)
            sums, counts = model.draw(rng, n, C, k)
            W = draw_cluster_weights(C, 2000, seed=C + 1)
            r = sums.sum(axis=0) / counts.sum()
            with calibration(*BEFORE):
                before = np.array(ratio_intervals(W, sums, counts, bounds=(0.0, np.inf)), dtype=np.float64)
            iv = np.array(ratio_intervals(W, sums, counts, bounds=(0.0, np.inf)), dtype=np.float64)
            cols = [rate(float(x), n) for x in ((before[:, 1] < model.mean).mean(), (iv[:, 1] < model.mean).mean(),
                                             (before[:, 0] > model.mean).mean(), (iv[:, 0] > model.mean).mean())]
            wb, wu = (float(np.median((x[:, 1] - r) / r)) for x in (before, iv))
            wl = float(np.median((r - iv[:, 0]) / r))
            print(f"| {model.name} | {C} | {n} | {' | '.join(cols)} | {wb:.3f} / {wu:.3f} | {wl:.3f} |", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000, sys.argv[2] if len(sys.argv) > 2 else "")
