"""The scorer's per-row statistics in one fused pass: compiled by torch's inductor (C++) where it pays.

Reasoning: docs/performance.md §"The fused metric pass".
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from functools import lru_cache

import torch

__all__ = [
    "COMPILE_MIN_ELEMENTS", "STAT_NAMES", "argmax_from_top", "available", "compiled_row_stats", "compiler_path", "kernel_choice", "row_stats",
    "use_compiled",
]

#: Logits per side (rows x vocabulary) from which ``auto`` compiles: 2^28, about 1,100 rows at a
#: 248,320-token vocabulary (half a context of the seed suite), 65,536 rows at 4,096.
COMPILE_MIN_ELEMENTS = 1 << 28
#: The rows of :func:`row_stats`'s first result, in order. kld_s: sum p*s_a*d; s_a, s_b: sums of
#: the shifted exponentials; s_min: sum min(P, Q s_a/s_b); j_min: sum min * |d|; j_sum: sum
#: (P + Q s_a/s_b) * log1p(tanh(|d|/2)); rev_neg: sum Q s_a/s_b * d; ent_neg: sum P * X; ln_a: ln s_a.
STAT_NAMES = ("kld_s", "s_a", "s_min", "j_min", "j_sum", "rev_neg", "ent_neg", "ln_a", "s_b")
_CHOICES = ("auto", "inductor", "eager")


def row_stats(ref: torch.Tensor, cand: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-row statistics of fp32 logits ``ref``, ``cand`` ``[rows, vocab]``.

    Returns ``(stats [9, rows] float64 in the order of STAT_NAMES, max ref, max cand)``;
    X = ref - max ref, Y = cand - max cand, P = exp X, Q = exp Y (see
    :func:`harness.scoring.torch_path._metrics_chunk` for why each term is formed as it is). The
    argmaxes are not computed here: index tracking costs the compiled kernel more than the maxima
    themselves; the caller takes them from the top-k sets it needs anyway (:func:`argmax_from_top`).
    """
    f64 = torch.float64
    mx_a = ref.amax(1)
    mx_b = cand.amax(1)
    x = ref - mx_a[:, None]
    y = cand - mx_b[:, None]
    p = torch.exp(x)
    q = torch.exp(y)
    s_a = p.sum(1, dtype=f64)
    s_b = q.sum(1, dtype=f64)
    ln_a = s_a.log()
    ln_b = s_b.log()
    ent_neg = (p * x).sum(1, dtype=f64)
    d = (x - y) - (ln_a - ln_b).float()[:, None]
    qs = q * (s_a / s_b).float()[:, None]
    kld_s = (p * d).sum(1, dtype=f64)
    rev_neg = (qs * d).sum(1, dtype=f64)
    mn = torch.minimum(p, qs)
    s_min = mn.sum(1, dtype=f64)
    a = d.abs()
    j_min = (mn * a).sum(1, dtype=f64)
    # log1p(tanh(a/2)): the eager pass forms tanh(a/2) as -expm1(-a) / (2 + expm1(-a)); inductor
    # lowers expm1 to exp - 1 (cancellation for small a), so the kernel takes tanh directly.
    j_sum = ((p + qs) * torch.log1p(torch.tanh(0.5 * a))).sum(1, dtype=f64)
    stats = torch.stack([kld_s, s_a, s_min, j_min, j_sum, rev_neg, ent_neg, ln_a, s_b])
    return stats, mx_a, mx_b


def argmax_from_top(x: torch.Tensor, top_ids: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """The first (lowest-id) argmax of each row of ``x``, as ``torch.max`` gives it, from ``top_ids``
    (``[rows, k]`` ids of a set of the k largest entries of each row) and the row maxima.

    Exact: when fewer than k entries of a row equal its maximum, every one of them is in the top-k
    set (they are strictly larger than the k-th largest), so the lowest id among the set's maximal
    entries is the row's; a row whose k-th largest entry equals the maximum (k or more ties) is
    resolved by ``torch.max`` on that row.
    """
    vals = x.gather(1, top_ids)
    at_max = vals == row_max[:, None]
    am = torch.where(at_max, top_ids, torch.full_like(top_ids, x.shape[1])).amin(1)
    crowded = at_max[:, -1].nonzero().view(-1)
    if crowded.numel():
        am[crowded] = torch.max(x[crowded], dim=1).indices
    return am


def kernel_choice() -> str:
    """``FIDELITY_METRIC_KERNEL`` (auto | inductor | eager), checked."""
    choice = os.environ.get("FIDELITY_METRIC_KERNEL", "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"FIDELITY_METRIC_KERNEL: expected one of {', '.join(_CHOICES)}, found {choice!r}")
    return choice


def compiler_path() -> str | None:
    """The C++ compiler inductor would use (``CXX`` or the first of c++/g++/clang++ on PATH)."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


@lru_cache(maxsize=1)
def _compiled() -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    """:func:`row_stats` under ``torch.compile`` (dynamic shapes: one compile for every rows x vocab)."""
    return torch.compile(row_stats, dynamic=True, fullgraph=True)


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether the compiled kernel builds here and agrees with eager torch on a small input (once per process)."""
    if compiler_path() is None:
        return False
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 1000, generator=g) * 4
    cand = ref + 0.1 * torch.randn(3, 1000, generator=g)
    try:
        with torch.inference_mode():
            got = _compiled()(ref, cand)
    except Exception:  # noqa: BLE001 - any compile failure (no compiler, inductor error) means eager
        return False
    with torch.inference_mode():
        want = row_stats(ref, cand)  # the same formulas in eager torch: only summation order differs
    close = torch.allclose(got[0], want[0], rtol=1e-4, atol=1e-6)
    return bool(close and torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]))


def use_compiled(rows: int, vocab: int, device: torch.device) -> bool:
    """Whether the scorer's metric pass over ``rows x vocab`` logits per side runs compiled (see docs/performance.md §"The fused metric pass")."""
    choice = kernel_choice()
    if device.type != "cpu" or choice == "eager":
        return False
    if choice == "auto":
        return rows * vocab >= COMPILE_MIN_ELEMENTS and available()
    if not available():
        raise RuntimeError(f"FIDELITY_METRIC_KERNEL=inductor: expected torch.compile to build the metric kernel, found "
                           f"it does not here (C++ compiler: {compiler_path() or 'none on PATH'})")
    return True


def compiled_row_stats(ref: torch.Tensor, cand: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:func:`row_stats` through the compiled kernel (call :func:`use_compiled` first)."""
    result: tuple[torch.Tensor, ...] = _compiled()(ref, cand)
    return result
