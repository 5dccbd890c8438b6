"""The cheap proxy of a choice's effect: the per-module teacher-forced output error of ``fidelity layers``.

For unit ``u`` with reference weight ``W`` and input rows ``X`` (the unit's inputs in the reference's own
forward over a few contexts: teacher-forced), the error of choice ``c`` is the relative output error energy
``e(u, c) = ‖X (W_c − W)ᵀ‖² / ‖X Wᵀ‖²`` (the square of ``fidelity layers``' per-module ``rel_frobenius``). A
group's proxy for choice ``c`` relative to the base layout is ``Σ_u e(u, c) − e(u, base_u)`` over its units:
one forward in all, no scoring. The proxy is a distance of module outputs, not an effect on the output
distribution: how well it ranks the measured effects is stated as Spearman's ρ and Kendall's τ over every
measured (group, choice) (:func:`rank_agreement`, ``scipy.stats``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from harness.allocation.family import Family
from harness.allocation.records import RankAgreement


def unit_errors(family: Family, inputs: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """``{unit: {choice: e(u, c)}}`` (module docstring)."""
    out: dict[str, dict[str, float]] = {}
    for u in family.units:
        x = inputs[u].double()
        w = reference[u].double()
        ref = float((x @ w.T).square().sum())
        row = {}
        for c in family.choices:
            d = torch.from_numpy(np.asarray(family.weight(u, c), dtype=np.float64)) - w
            row[c] = float((x @ d.T).square().sum()) / ref if ref else 0.0
        out[u] = row
    return out


def group_proxy(errors: Mapping[str, Mapping[str, float]], units: Sequence[str], base: Mapping[str, str], choice: str) -> float:
    """The group's proxy for ``choice`` relative to the base layout (module docstring)."""
    return float(sum(errors[u][choice] - errors[u][base[u]] for u in units))


def rank_agreement(proxy: Sequence[float], measured: Sequence[float]) -> RankAgreement:
    """Spearman's ρ and Kendall's τ (with their p-values) between proxy and measured effects; None where undefined
    (fewer than three pairs, or one side constant)."""
    from scipy.stats import kendalltau, spearmanr

    if len(proxy) < 3:
        return {"n": len(proxy), "spearman": None, "kendall": None}
    rho = spearmanr(proxy, measured)
    tau = kendalltau(proxy, measured)

    def num(x: float) -> float | None:  # undefined (a constant side): None, never NaN in a report
        return float(x) if math.isfinite(float(x)) else None

    return {"n": len(proxy), "spearman": num(rho.statistic), "spearman_p": num(rho.pvalue),
            "kendall": num(tau.statistic), "kendall_p": num(tau.pvalue)}
