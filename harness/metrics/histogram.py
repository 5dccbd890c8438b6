"""Fixed log-spaced KLD histogram (docs/design.md, section 2).

Edges are fixed by the protocol, not by the data, so the counts of two shards add exactly
(percentiles do not). Bins: ``[1e-12, 1e2)`` nats, 40 per decade (560 bins), plus an explicit
underflow bin (``x < 1e-12``, including exact zeros and rounding-level negatives) first and an
overflow bin (``x >= 1e2``) last: 562 counts in all. A value ``x`` goes to the bin ``i`` with
``edges[i] <= x < edges[i+1]``.

From counts alone one can only bracket a quantile: :meth:`LogHistogram.quantile_bounds`
returns the bin edges that must contain numpy's "linear" quantile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.metrics.records import HistogramJSON, HistogramSpec

LO_EXP = -12
HI_EXP = 2
BINS_PER_DECADE = 40
N_BINS = (HI_EXP - LO_EXP) * BINS_PER_DECADE
#: Interior edges, float64, ``10 ** (LO_EXP + k / BINS_PER_DECADE)`` for k = 0 .. N_BINS.
EDGES = 10.0 ** (LO_EXP + np.arange(N_BINS + 1, dtype=np.float64) / BINS_PER_DECADE)
#: Thresholds (nats) with exact exceedance counts (``x > t``), computed from the raw values.
EXCEEDANCE_THRESHOLDS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)

SPEC: HistogramSpec = {
    "kind": "log10",
    "lo": 10.0**LO_EXP,
    "hi": 10.0**HI_EXP,
    "bins_per_decade": BINS_PER_DECADE,
    "n_counts": N_BINS + 2,
    "layout": "counts[0] = underflow (x < lo, incl. zero/negative); counts[1 + i] = [edge_i, edge_{i+1}) with "
    "edge_k = 10**(log10(lo) + k / bins_per_decade); counts[-1] = overflow (x >= hi)",
}


def bin_index(values: np.ndarray) -> np.ndarray:
    """Count index (0 = underflow, 1..N_BINS interior, N_BINS + 1 = overflow) of each value."""
    v = np.asarray(values, dtype=np.float64)
    if np.isnan(v).any():
        raise ValueError("histogram: NaN value")
    return np.searchsorted(EDGES, v, side="right")  # 0 below lo, len(EDGES) at/above hi


@dataclass
class LogHistogram:
    counts: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS + 2, dtype=np.int64))

    @classmethod
    def from_values(cls, values: np.ndarray) -> LogHistogram:
        return cls(np.bincount(bin_index(values), minlength=N_BINS + 2).astype(np.int64))

    def __add__(self, other: LogHistogram) -> LogHistogram:
        return LogHistogram(self.counts + other.counts)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def bin_bounds(self, i: int) -> tuple[float, float]:
        """Value range of count index ``i`` (±inf for the open under/overflow bins)."""
        if i == 0:
            return (-math.inf, float(EDGES[0]))
        if i == N_BINS + 1:
            return (float(EDGES[-1]), math.inf)
        return (float(EDGES[i - 1]), float(EDGES[i]))

    def quantile_bounds(self, q: float) -> tuple[float, float]:
        """Bounds on numpy's "linear" quantile ``q`` from counts alone: ``lo <= quantile <= hi``."""
        n = self.total
        if n == 0:
            raise ValueError("histogram: quantile of an empty histogram")
        h = (n - 1) * q
        cum = np.cumsum(self.counts)
        i_lo = int(np.searchsorted(cum, math.floor(h), side="right"))
        i_hi = int(np.searchsorted(cum, math.ceil(h), side="right"))
        return (self.bin_bounds(i_lo)[0], self.bin_bounds(i_hi)[1])

    def to_json(self) -> HistogramJSON:
        return {"spec": HistogramSpec(**SPEC), "counts": [int(c) for c in self.counts]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LogHistogram:
        spec = d.get("spec", {})
        for k in ("lo", "hi", "bins_per_decade", "n_counts"):
            if spec.get(k) != SPEC[k]:
                raise ValueError(f"histogram spec {k}: expected {SPEC[k]!r}, found {spec.get(k)!r}")
        counts = np.asarray(d["counts"], dtype=np.int64)
        if counts.shape != (N_BINS + 2,):
            raise ValueError(f"histogram counts: expected {N_BINS + 2}, found {counts.shape[0]}")
        return cls(counts)


def exceedance_counts(values: np.ndarray) -> dict[str, int]:
    """Exact counts of values strictly above each threshold in :data:`EXCEEDANCE_THRESHOLDS`."""
    v = np.asarray(values, dtype=np.float64)
    return {f"{t:g}": int(np.count_nonzero(v > t)) for t in EXCEEDANCE_THRESHOLDS}
