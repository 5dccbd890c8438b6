"""Source-cluster bootstrap (docs/design.md, section 2).

The unit of statistical independence is the *source cluster* (the document or conversation a
context was cut from). A replicate resamples the C clusters with replacement and keeps every
position of every context in them; cluster ``c`` drawn ``W[b, c]`` times contributes its positions
``W[b, c]`` times. A replicate draws C cluster ids uniformly with replacement (``rng.integers``) and counts them, so
all replicates come at once as an integer matrix ``W [B, C]`` (each row a Multinomial(C, 1/C) draw)
from ``numpy.random.default_rng(seed)``.

* Means (KLD, top-1, EAR, JSD) are ratios of sums: ``(W @ cluster_sums) / (W @ cluster_counts)``:
  vectorized, O(B * C).
* Tail statistics (p99, CVaR1) use the same multiplicities as position weights on the pooled
  positions (never per-context quantiles); only the descending-sorted top of the data is
  needed, see :mod:`harness.metrics.tails`. They use ``n_boot_tails`` replicates (default 2,000,
  the first rows of the same draw matrix) because each costs O(tail size).
* Intervals are percentile intervals (2.5 %, 97.5 %).
* Paired comparisons apply the same ``W`` to both candidates (common random numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.metrics.tails import weighted_tail_stats

DEFAULT_SEED = 20240601
DEFAULT_N_BOOT = 10_000
DEFAULT_N_BOOT_TAILS = 2_000
LEVEL = 0.95
_BLOCK = 128  # replicates per block in the tail bootstrap (bounds memory: BLOCK x tail size)


def draw_cluster_weights(n_clusters: int, n_boot: int, seed: int) -> np.ndarray:
    """Multiplicities ``[n_boot, n_clusters]`` (int32) of a cluster bootstrap with replacement."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_clusters, size=(n_boot, n_clusters), dtype=np.int64)
    idx += (np.arange(n_boot, dtype=np.int64) * n_clusters)[:, None]
    counts = np.bincount(idx.ravel(), minlength=n_boot * n_clusters)
    return counts.reshape(n_boot, n_clusters).astype(np.int32)


def percentile_interval(replicates: np.ndarray, level: float = LEVEL) -> list[float]:
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(replicates, [a, 1.0 - a], method="linear")
    return [float(lo), float(hi)]


def ratio_replicates(weights: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``(W @ sums) / (W @ counts)`` per replicate (counts > 0 in every replicate: C >= 1 drawn).

    ``sums`` may be ``[C]`` or ``[C, k]`` (k statistics at once, one matrix product)."""
    w = weights if weights.dtype == np.float64 else weights.astype(np.float64)
    s = np.asarray(sums, dtype=np.float64)
    den = w @ np.asarray(counts, dtype=np.float64)
    num = w @ s
    return num / (den[:, None] if num.ndim == 2 else den)


@dataclass
class TailData:
    """Positions sorted descending, with cluster ids, for the tail bootstrap."""

    desc_values: np.ndarray
    desc_cluster: np.ndarray
    cluster_counts: np.ndarray

    @classmethod
    def build(cls, values: np.ndarray, cluster_of_position: np.ndarray, n_clusters: int) -> TailData:
        order = np.argsort(-values, kind="stable")
        return cls(
            values[order].astype(np.float64),
            cluster_of_position[order],
            np.bincount(cluster_of_position, minlength=n_clusters).astype(np.float64),
        )


def tail_replicates(
    data: TailData, weights: np.ndarray, q: float = 0.99, alpha: float = 0.01
) -> tuple[np.ndarray, np.ndarray]:
    """Replicates of the "linear" quantile ``q`` and CVaR(``alpha``) under cluster multiplicities ``weights``."""
    n = data.desc_values.shape[0]
    totals_all = weights.astype(np.float64) @ data.cluster_counts
    quants = np.empty(weights.shape[0])
    cvars = np.empty(weights.shape[0])
    depth = min(n, max(256, int(1.5 * (1.0 - min(q, 1.0 - alpha)) * n) + 256))
    for b0 in range(0, weights.shape[0], _BLOCK):
        wb = weights[b0 : b0 + _BLOCK]
        tot = totals_all[b0 : b0 + _BLOCK]
        m = depth
        while True:
            qv, cv, ok = weighted_tail_stats(data.desc_values[:m], wb[:, data.desc_cluster[:m]], tot, q, alpha)
            if ok.all() or m >= n:
                break
            m = min(n, 2 * m)
        quants[b0 : b0 + _BLOCK] = qv
        cvars[b0 : b0 + _BLOCK] = cv
    return quants, cvars
