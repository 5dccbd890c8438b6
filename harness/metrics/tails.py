"""Tail statistics: numpy "linear" quantiles and CVaR, plain and with integer multiplicity weights.

CVaR at level ``alpha`` (CVaR1% has ``alpha = 0.01``) is the mean of the worst ``k = alpha * n``
positions with a fractional boundary weight: the sum of the ``floor(k)`` largest values plus
``(k - floor(k))`` times the next one, divided by ``k``. For ``k < 1`` it is the maximum.

The weighted forms treat a position of weight ``w`` (an integer cluster multiplicity from the
bootstrap) as ``w`` copies, so they equal the plain forms on the expanded sample exactly, without
expanding it. They work on the descending-sorted top of the data only (the tail), which is what
makes tail bootstrap intervals affordable.
"""

from __future__ import annotations

import math

import numpy as np


def quantile(values: np.ndarray, q: float) -> float:
    """numpy "linear" quantile."""
    return float(np.quantile(np.asarray(values, dtype=np.float64), q, method="linear"))


def cvar(values: np.ndarray, alpha: float = 0.01) -> float:
    """Mean of the worst ``alpha`` fraction with fractional boundary weight (see module docstring)."""
    v = np.asarray(values, dtype=np.float64)
    n = v.shape[0]
    if n == 0:
        raise ValueError("cvar of an empty array")
    k = alpha * n
    if k <= 1.0:
        return float(v.max())
    kf = math.floor(k)
    top = -np.partition(-v, kf)[: kf + 1] if kf < n else -np.sort(-v)
    top = np.sort(top)[::-1]
    s = float(top[:kf].sum())
    if kf < n:
        s += (k - kf) * float(top[kf])
    return s / k


def weighted_tail_stats(
    desc_values: np.ndarray,
    desc_weights: np.ndarray,
    totals: np.ndarray,
    q: float,
    alpha: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per replicate: "linear" quantile ``q`` and CVaR(``alpha``) of the expanded sample.

    ``desc_values``: the top M values in descending order ``[M]``; ``desc_weights``: their integer
    multiplicities per replicate ``[B, M]``; ``totals``: the expanded sample size per replicate
    ``[B]``. Returns ``(quantiles, cvars, ok)``; ``ok`` is False where the top M do not reach
    deep enough (the caller widens M and retries).
    """
    w = desc_weights.astype(np.float64)
    cum = np.cumsum(w, axis=1)  # expanded count of the top i+1 values
    m = desc_values.shape[0]
    # quantile: ascending index h = (n-1) q  <=> rank from top r = (n-1)(1-q), 0-based
    r = (totals - 1.0) * (1.0 - q)
    r_hi = np.floor(r)  # from-top rank of the larger neighbour
    frac = r - r_hi  # weight of the smaller neighbour (one rank further down)
    i_a = (cum <= r_hi[:, None]).sum(1)
    i_b = (cum <= (r_hi + 1.0)[:, None]).sum(1)
    need_b = frac > 0
    ok = (i_a < m) & (~need_b | (i_b < m))
    va = desc_values[np.minimum(i_a, m - 1)]
    vb = desc_values[np.minimum(i_b, m - 1)]
    quant = va + frac * (vb - va)
    # CVaR: sum of the floor(k) largest + (k - floor(k)) * the next, over k
    k = alpha * totals
    kf = np.floor(k)
    cum_prev = cum - w
    take = np.clip(kf[:, None] - cum_prev, 0.0, w)
    s = take @ desc_values
    i_n = (cum <= kf[:, None]).sum(1)
    ok &= i_n < m
    s = s + (k - kf) * desc_values[np.minimum(i_n, m - 1)]
    small = k <= 1.0
    cv = np.where(small, desc_values[0] if m else 0.0, s / np.where(small, 1.0, k))
    # with k <= 1 the CVaR is the max of the expanded sample: the first value with weight > 0
    if small.any():
        first = (cum <= 0).sum(1)
        cv = np.where(small, desc_values[np.minimum(first, m - 1)], cv)
    return quant, cv, ok
