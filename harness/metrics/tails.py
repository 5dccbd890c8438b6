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
    return float(s / k)


def _rank_index(cum: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Per row b: the number of entries of the non-decreasing row ``cum[b]`` that are <= ``ranks[b]``,
    i.e. the index of the value holding expanded rank ``ranks[b]`` (0-based from the top).
    One ``searchsorted`` over the rows laid end to end with increasing offsets."""
    b, m = cum.shape
    span = float(cum[:, -1].max()) + float(np.max(ranks, initial=0.0)) + 2.0
    off = np.arange(b, dtype=np.float64) * span
    flat = (cum + off[:, None]).ravel()
    idx: np.ndarray = np.searchsorted(flat, ranks + off, side="right") - np.arange(b) * m
    return idx


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
    v = np.asarray(desc_values, dtype=np.float64)
    m = v.shape[0]
    w = np.asarray(desc_weights)
    cum = np.cumsum(w, axis=1, dtype=np.float64)  # expanded count of the top i+1 values
    totals = np.asarray(totals, dtype=np.float64)
    # quantile: ascending index h = (n-1) q  <=>  rank from the top r = (n-1)(1-q), 0-based
    r = (totals - 1.0) * (1.0 - q)
    r_hi = np.floor(r)  # rank of the larger neighbour
    frac = r - r_hi  # weight of the next smaller one
    i_a = _rank_index(cum, r_hi)
    i_b = _rank_index(cum, r_hi + 1.0)
    ok = (i_a < m) & ((frac == 0) | (i_b < m))
    va = v[np.minimum(i_a, m - 1)]
    vb = v[np.minimum(i_b, m - 1)]
    quant = va + frac * (vb - va)
    # CVaR: (sum of the floor(k) largest + (k - floor(k)) * the next) / k; the value holding rank
    # floor(k) is v[i_n], and everything above it sums to cwv[i_n - 1]
    k = alpha * totals
    kf = np.floor(k)
    i_n = _rank_index(cum, kf)
    ok &= i_n < m
    cwv = np.cumsum(w * v[None, :], axis=1)
    rows = np.arange(w.shape[0])
    prev = np.maximum(i_n - 1, 0)
    has_prev = i_n > 0
    s_prev = np.where(has_prev, cwv[rows, prev], 0.0)
    c_prev = np.where(has_prev, cum[rows, prev], 0.0)
    cv = (s_prev + (k - c_prev) * v[np.minimum(i_n, m - 1)]) / np.where(k > 1.0, k, 1.0)
    # with k <= 1 the CVaR is the max of the expanded sample: the first value with weight > 0
    small = k <= 1.0
    if small.any():
        first = _rank_index(cum, np.zeros_like(k))
        cv = np.where(small, v[np.minimum(first, m - 1)], cv)
    return quant, cv, ok
