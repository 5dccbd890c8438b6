"""``fidelity plan``: how many contexts and clusters a verdict needs, from a pilot run's shard reports."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.cli.registry import Builder, SubParsers, formatter
from harness.cli.vocabulary import add_reports
from harness.errors import FidelityError, UsageError
from harness.io.atomic import atomic_write_json
from harness.reports.aggregate import check_comparable
from harness.reports.report_set import load_reports


def _rows(groups: dict[str, list[Any]], name: str) -> list[dict[str, Any]]:
    if name not in groups:
        raise FidelityError(f"no shard reports of candidate {name!r} (found: {', '.join(groups) or 'none'})")
    check_comparable(groups[name])  # one candidate, comparable shards, rows that add up
    return [row for r in groups[name] for row in r.metrics["contexts"]]


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {v}")
    return v


def _plan(a: argparse.Namespace) -> int:

    from harness.planning.design import (
        ClusterPilot,
        achievable_eps,
        clusters_for_difference,
        clusters_for_precision,
        power_at,
        resolvable_delta,
    )

    groups = load_reports(a.reports)
    rows = _rows(groups, a.candidate)
    p = ClusterPilot.from_rows(rows)
    if p.n_clusters < 3:
        raise FidelityError(f"{a.candidate}: the pilot has {p.n_clusters} source clusters; at least 3 are needed to plan")
    out: dict[str, Any] = {
        "schema": "fidelity.plan/1", "candidate": a.candidate, "level": 0.95, "power": 0.80,
        "pilot": {"contexts": len(rows), "clusters": p.n_clusters, "positions": int(p.positions.sum()),
                  "mean_kld": p.mean, "contexts_per_cluster": p.contexts_per_cluster},
        "current": {"eps": achievable_eps(p)},
    }
    print(f"pilot {a.candidate}: {len(rows)} contexts in {p.n_clusters} clusters, mean KLD {p.mean:.4g}")
    print(f"this suite: mean KLD known within ±{100 * out['current']['eps']:.2f}% (95%)")
    if a.eps:
        c = clusters_for_precision(p, a.eps)
        out["precision"] = _needed({"eps": a.eps}, c, p.contexts_per_cluster)
        print(f"±{100 * a.eps:g}% relative at 95%: {_say(c, p.contexts_per_cluster)}")
    if a.versus:
        if a.versus == a.candidate:
            raise UsageError(f"plan --versus: expected another candidate than --candidate, found {a.versus!r} twice "
                             "(a candidate compared with itself has no difference to resolve)")
        try:
            d = ClusterPilot.from_rows(rows, _rows(groups, a.versus))
        except ValueError as e:
            raise FidelityError(f"plan --versus {a.versus}: expected the contexts of {a.candidate}, found {e}") from None
        if not d.sums.any():
            raise FidelityError(f"plan --versus {a.versus}: expected a difference from {a.candidate}, found the same "
                                "KLD sum in every source cluster (one model twice?)")
        out["versus"] = {"candidate": a.versus, "observed_difference": d.mean, "resolvable_delta": resolvable_delta(d)}
        print(f"vs {a.versus}: observed difference {d.mean:.4g}; this suite resolves δ ≥ {resolvable_delta(d):.4g} "
              f"(95% confidence, 80% power, paired)")
        if a.delta:
            c = clusters_for_difference(d, a.delta)
            out["versus"].update(_needed({"delta": a.delta}, c, d.contexts_per_cluster))
            out["versus"]["power_now"] = power_at(d, a.delta, d.n_clusters)
            print(f"δ = {a.delta:g}: {_say(c, d.contexts_per_cluster)} for 80% power "
                  f"(power with this suite: {100 * out['versus']['power_now']:.1f}%)")
    if a.out:
        atomic_write_json(a.out, out)
        print(f"written: {a.out}")
    return 0


def _needed(doc: dict[str, Any], clusters: int | None, per_cluster: float) -> dict[str, Any]:
    """``clusters`` and ``contexts`` needed; when the search hit its cap, both ``null`` and ``more_than_clusters``."""
    import math

    from harness.planning.design import MAX_CLUSTERS

    if clusters is None:
        return {**doc, "clusters": None, "contexts": None, "more_than_clusters": MAX_CLUSTERS}
    return {**doc, "clusters": clusters, "contexts": math.ceil(clusters * per_cluster)}


def _say(clusters: int | None, per_cluster: float) -> str:
    import math

    from harness.planning.design import MAX_CLUSTERS

    if clusters is None:
        return f"more than {MAX_CLUSTERS} clusters (the search stops there)"
    return f"{clusters} clusters ≈ {math.ceil(clusters * per_cluster)} contexts"


def add_plan(sub: SubParsers) -> None:
    p = sub.add_parser(
        "plan", help="contexts and clusters needed for a precision or to separate two candidates (from a pilot run)",
        formatter_class=formatter,
        description=(
            "From a pilot run's shard reports (their per-context rows and source clusters): how many clusters\n"
            "and contexts estimate the candidate's mean KLD within ±EPS relative (95%), or separate it from\n"
            "another candidate scored on the same suite by DELTA nats (95% confidence, 80% power, paired\n"
            "cluster design); and the reverse: what the current suite resolves.\n\n"
            "examples:\n"
            "  fidelity plan fidelity-reports --candidate int4_g32 --eps 0.02\n"
            "  fidelity plan fidelity-reports --candidate int4_g32_sr1 --versus int4_g32_sr2 --delta 2e-4"
        ),
    )
    add_reports(p, "shard report files or folders", positional=True, many=True, required=True)
    p.add_argument("--candidate", required=True, help="the pilot candidate")
    p.add_argument("--versus", help="a second candidate on the same contexts (paired difference)")
    p.add_argument("--eps", type=_positive, help="relative half-width wanted, e.g. 0.02")
    p.add_argument("--delta", type=_positive, help="difference in mean KLD to detect, nats (needs --versus)")
    p.add_argument("--out", type=Path, help="write the plan as JSON")
    p.set_defaults(func=_plan)


COMMANDS: tuple[Builder, ...] = (add_plan,)
