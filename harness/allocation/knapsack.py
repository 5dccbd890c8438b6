"""The multiple-choice knapsack of a layout search, solved exactly by ``scipy.optimize.milp``.

Groups ``g = 1..G``, each with options ``o`` of cost ``b[g][o]`` bytes (integers) and value ``d[g][o]`` (the
predicted change of mean KLD, nats). Pick exactly one option per group, minimising ``Σ d`` subject to
``Σ b <= budget``: binary variables ``x[g][o]``, one equality ``Σ_o x[g][o] = 1`` per group and one inequality
for the budget. HiGHS (scipy's MILP solver) proves optimality with a relative gap of 0 (``mip_rel_gap=0``), so
the answer is the exact optimum of this model (the values are the measured effects, taken as additive:
:mod:`harness.allocation.plan` states and measures that assumption).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.errors import FidelityError


def solve(costs: Sequence[Sequence[int]], values: Sequence[Sequence[float]], budget: int) -> list[int]:
    """The chosen option of each group (an index into its options) at the minimum total value within ``budget``."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    if len(costs) != len(values) or any(len(c) != len(v) or not c for c, v in zip(costs, values)):
        raise FidelityError("knapsack: every group needs one or more options, each with a cost and a value")
    sizes = [len(c) for c in costs]
    n = sum(sizes)
    c = np.concatenate([np.asarray(v, dtype=np.float64) for v in values])
    b = np.concatenate([np.asarray(x, dtype=np.float64) for x in costs])
    if int(np.sum([min(x) for x in costs])) > budget:
        raise FidelityError(f"knapsack: no layout fits {budget} bytes (the smallest takes {sum(min(x) for x in costs)})")
    rows = np.zeros((len(sizes), n))
    start = 0
    for g, k in enumerate(sizes):
        rows[g, start : start + k] = 1.0
        start += k
    cons = [LinearConstraint(rows, 1.0, 1.0), LinearConstraint(b[None, :], -np.inf, float(budget))]
    res = milp(c, constraints=cons, integrality=np.ones(n), bounds=Bounds(0.0, 1.0),
               options={"mip_rel_gap": 0.0, "presolve": True})
    if res.x is None or not res.success:
        raise FidelityError(f"knapsack: the solver found no optimum ({res.message})")
    x = np.rint(res.x).astype(int)
    picks = []
    start = 0
    for k in sizes:
        chosen = np.flatnonzero(x[start : start + k])
        if len(chosen) != 1:
            raise FidelityError("knapsack: the solver's answer does not pick one option per group")
        picks.append(int(chosen[0]))
        start += k
    return picks
