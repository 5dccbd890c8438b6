"""Tolerances for comparing two fp32 evaluations of the scorer that differ only in summation order.

Two tilings (or a streamed and a whole-shard pass) give the GEMM different blockings, so each logit
is summed in a different order; how the digits differ depends on the CPU's kernel (Intel AMX, AMD
AVX-512 or AVX2), so a fixed ``rtol=1e-6`` passes on one CPU and fails on another. These bounds
follow from the fp32 accumulation bound instead (Higham, *Accuracy and Stability*, 3.1):

* a logit ``sum_k x_k w_k`` summed in fp32 in any order lies within
  ``e = gamma_H * sum_k |x_k||w_k|`` of its exact value, ``gamma_n = n u / (1 - n u)``, ``u = 2^-24``;
* the metric pass rounds each shifted logit, its exponential and the difference of log-probabilities
  to fp32: per token an error of at most ``4 u (R + 1)`` in a log-probability, ``R`` the row's logit range;
* so each evaluation's ``ln p_j`` and ``ln q_j`` lie within ``delta = 2 e + 4 u (R + 1)`` of the exact
  values (log-softmax is 2-Lipschitz in the max norm), and two evaluations within ``D = 2 delta``.

Each score's tolerance is the first-order consequence of ``D`` (see :func:`score_tolerances`); the
discrete scores (argmax, top-k overlaps) must agree exactly wherever the exact logits' gap at the
deciding place exceeds ``2 e``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from harness.metrics.scores import PositionScores

U32 = 2.0**-24


def gamma(n: int, u: float = U32) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative bound of an n-term sum in precision ``u``."""
    return n * u / (1.0 - n * u)


def _logits64(hidden: torch.Tensor, head: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The exact (float64) logits and, per row, the accumulation bound ``gamma_H max_j sum_k |x_k||w_jk|``."""
    x = hidden.double().numpy()
    w = head.double().numpy()
    exact = x @ w.T
    bound = gamma(x.shape[1]) * (np.abs(x) @ np.abs(w).T).max(axis=1)
    return exact, bound


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def _gap(z: np.ndarray, k: int) -> np.ndarray:
    """Per row, the gap between the k-th and (k+1)-th largest exact logit (inf when k >= vocab)."""
    if k >= z.shape[1]:
        return np.full(z.shape[0], np.inf)
    s = -np.sort(-z, axis=1)
    gap: np.ndarray = s[:, k - 1] - s[:, k]
    return gap


def score_tolerances(
    ref_hidden: torch.Tensor, cand_hidden: torch.Tensor, head: torch.Tensor, cand_head: torch.Tensor | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per-row absolute tolerances of every float score, and per-row masks where each integer score must agree.

    With ``D`` as in the module docstring, ``M = max_j |ln p_j - ln q_j|`` and ``H`` the exact entropy:
    NLLs ``D``; ``p``/``q`` at the reference's top ``expm1(D)`` relative; the two KLs and the JSD (in
    nats, then bits) ``expm1(D) M + 2 D e^D``; the entropy ``expm1(D) H + D e^D``; the EAR ``2 expm1(D)``.
    """
    za, ea = _logits64(ref_hidden, head)
    zb, eb = _logits64(cand_hidden, head if cand_head is None else cand_head)
    e = np.maximum(ea, eb)
    r = np.maximum(za.max(1) - za.min(1), zb.max(1) - zb.min(1))
    d = 2.0 * (2.0 * e + 4.0 * U32 * (r + 1.0))
    lp, lq = _log_softmax(za), _log_softmax(zb)
    m = np.abs(lp - lq).max(axis=1)
    h = -(np.exp(lp) * lp).sum(axis=1)
    grow = np.expm1(d)
    div = grow * m + 2.0 * d * np.exp(d)
    p_top = np.exp(lp.max(axis=1))
    q_top = np.exp(lq[np.arange(len(lq)), za.argmax(axis=1)])
    tol = {
        "kld": div, "kld_rev": div, "jsd_bits": div / math.log(2.0),
        "nll_ref": d, "nll_cand": d, "entropy_ref": grow * h + d * np.exp(d), "ear": 2.0 * grow,
        "p_ref_top": grow * p_top, "q_ref_top": grow * q_top,
    }
    clear_a = _gap(za, 1) > 2.0 * ea
    clear_b = _gap(zb, 1) > 2.0 * eb
    exact = {
        "argmax_ref": clear_a, "argmax_cand": clear_b,
        "top5_overlap": (_gap(za, 5) > 2.0 * ea) & (_gap(zb, 5) > 2.0 * eb),
        "top10_overlap": (_gap(za, 10) > 2.0 * ea) & (_gap(zb, 10) > 2.0 * eb),
    }
    # p and q at the reference's top token are compared only where that token is the same in both.
    tol["p_ref_top"] = np.where(clear_a, tol["p_ref_top"], np.inf)
    tol["q_ref_top"] = np.where(clear_a, tol["q_ref_top"], np.inf)
    return tol, exact


def assert_same_scores(
    got: PositionScores, want: PositionScores, ref_hidden: torch.Tensor, cand_hidden: torch.Tensor,
    head: torch.Tensor, cand_head: torch.Tensor | None = None, label: str = "",
) -> None:
    """``got`` and ``want`` (two fp32 summation orders of the same inputs) agree within :func:`score_tolerances`."""
    tol, exact = score_tolerances(ref_hidden, cand_hidden, head, cand_head)
    for name, bound in tol.items():
        a, b = getattr(got, name), getattr(want, name)
        bad = np.abs(a - b) > bound
        assert not bad.any(), (
            f"{name} {label}: rows {np.flatnonzero(bad)[:5].tolist()} differ by {np.abs(a - b)[bad][:5].tolist()} "
            f"beyond the fp32 accumulation bound {bound[bad][:5].tolist()}"
        )
    for name, mask in exact.items():
        np.testing.assert_array_equal(getattr(got, name)[mask], getattr(want, name)[mask], err_msg=f"{name} {label}")
    # The bound must leave rows to compare: a test whose every row is a near-tie would test nothing.
    assert all(mask.mean() > 0.5 for mask in exact.values()), {k: float(v.mean()) for k, v in exact.items()}
