"""Error rates of everything that reads the mean-KLD interval, per side, on the calibration shapes.

Run by hand (minutes): ``nice -n 5 python benchmarks/interval_consumers.py [reps] [parts] [models]`` prints the
Markdown tables of docs/statistics.md ("What reads the interval, measured"). ``parts`` (comma-separated, default all):
``adaptive`` (early wrong pass / wrong fail at true mean = threshold, :func:`harness.gate.adaptive.look_bounds`),
``paired`` (the verdict of :func:`harness.reports.paired.verdict` on the interval ``harness.metrics.paired`` computes:
"equivalent" at a true difference of +margin / -margin, "A better" / "B better" at a true difference of 0),
``windows`` (a window flip called a failure, :func:`harness.reports.windows` rule, when the true order does not
change), ``plan`` (``fidelity plan``'s predicted half-width and power, :mod:`harness.planning.design`, against the
interval and the paired verdict the harness then prints). Each production function is called as the harness calls it
(10,000 draws from the report's seed; the adaptive rule's 2,000), on ``reps`` data sets at once: a statistic's
interval never depends on the other statistics of the same call, so that is the per-report interval (checked below).
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

import harness
from harness.gate.adaptive import MIN_EARLY_CLUSTERS, alpha_per_look, look_bounds, side_of
from harness.metrics.bootstrap import (
    DEFAULT_N_BOOT,
    DEFAULT_SEED,
    draw_cluster_weights,
    ratio_interval,
    ratio_intervals,
)
from harness.metrics.simulation import FIXTURE, HEAVY, ClusterModel
from harness.planning.design import ClusterPilot, achievable_eps, resolvable_delta
from harness.reports.paired import verdict
from harness.reports.windows import WindowSummary, detectable_reversal

MODELS: tuple[ClusterModel, ...] = (FIXTURE, HEAVY)
#: (clusters, contexts per cluster): one shard of the embedded default, its ladder, a larger ladder, the seed suite.
LAYOUTS = ((16, 1), (47, 2), (85, 2), (842, 6))
#: (clusters, contexts per cluster, shards) of the adaptive rule (no early stop below 40 clusters).
ADAPTIVE_LAYOUTS = ((47, 2, 6), (85, 2, 6), (96, 1, 6), (842, 6, 6))
ADAPTIVE_N_BOOT = 2000  # AdaptiveMonitor's n_boot
SEED0 = 91_000  # seeds not used by the slow tier (1000-5000 + C)


def rate(hits: np.ndarray) -> str:
    """A rate in percent with its Monte-Carlo standard error."""
    n, x = hits.size, float(np.mean(hits))
    return f"{100 * x:.2f} ± {100 * math.sqrt(max(x, 1.0 / n) * (1.0 - x) / n):.2f} %"


def band(hits: np.ndarray, lo: float = 0.010, hi: float = 0.025) -> str:
    """``in``, ``LOW`` or ``HIGH`` against [lo, hi] with one Monte-Carlo SE of a rate at ``hi``."""
    x, se = float(np.mean(hits)), math.sqrt(hi * (1.0 - hi) / hits.size)
    return "HIGH" if x > hi + se else ("LOW" if x < lo - se else "in")


def intervals(W: np.ndarray, sums: np.ndarray, counts: np.ndarray, **kw: object) -> np.ndarray:
    """``ratio_intervals`` of every data set (column of ``sums``) as ``[R, 2]`` (nan: not estimable)."""
    ivs = ratio_intervals(W, sums, counts, **kw)  # type: ignore[arg-type]
    return np.array([iv if iv is not None else [math.nan, math.nan] for iv in ivs], dtype=np.float64)


def check_vectorized(W: np.ndarray, sums: np.ndarray, counts: np.ndarray, iv: np.ndarray) -> None:
    """The first data sets' intervals, one call each as a report makes it, equal the vectorized ones."""
    for j in range(min(3, sums.shape[1])):
        one = ratio_interval(W, sums[:, j], counts)
        assert one is not None and np.allclose(one, iv[j], rtol=1e-12, atol=0.0), (one, iv[j])


def diff_pilot(sums: np.ndarray, counts: np.ndarray, per_cluster: int) -> ClusterPilot:
    """A paired pilot of per-cluster differences (as ``ClusterPilot.from_rows(a, b)`` makes it; a planner without
    the ``difference`` field, before it read each side at its level, takes it as it took every pilot)."""
    extra = {"difference": True} if "difference" in ClusterPilot.__dataclass_fields__ else {}
    return ClusterPilot(sums, counts, np.full(counts.shape[0], float(per_cluster)), **extra)


def shard_plan(n_clusters: int, per_cluster: int, looks: int, seed: int) -> np.ndarray:
    """Shard of every context ``[C, k]``: contexts shuffled into equal shards (a cluster may span shards)."""
    n = n_clusters * per_cluster
    shard = np.empty(n, dtype=np.int64)
    shard[np.random.default_rng(seed).permutation(n)] = np.arange(n) * looks // n
    return shard.reshape(n_clusters, per_cluster)


def adaptive(model: ClusterModel, C: int, k: int, looks: int, reps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per data set: early wrong pass, early wrong fail (true mean = threshold), looks as AdaptiveMonitor takes them."""
    ctx = model.draw_contexts(np.random.default_rng(seed), reps, C, k)
    plan = shard_plan(C, k, looks, seed)
    passed, failed = np.zeros(reps, dtype=bool), np.zeros(reps, dtype=bool)
    first = None
    for look in range(1, looks):
        seen = plan < look
        keep = seen.any(axis=1)
        if first is None and keep.sum() >= MIN_EARLY_CLUSTERS:
            first = look
        a_k = alpha_per_look(looks, first)
        if a_k is None:
            continue
        sums = (ctx * seen[:, :, None]).sum(axis=1)[keep]
        counts = seen.sum(axis=1)[keep].astype(np.float64) * model.positions
        sides = [side_of(lo, hi, model.mean) for lo, hi in look_bounds(sums, counts, a_k, ADAPTIVE_N_BOOT, DEFAULT_SEED)]
        open_ = ~(passed | failed)
        passed |= open_ & np.array([s == "below" for s in sides])
        failed |= open_ & np.array([s == "above" for s in sides])
    return passed, failed


def paired_rows(reps: int, seed: int) -> Iterator[str]:
    for model in MODELS:
        for C, k in LAYOUTS:
            W = draw_cluster_weights(C, DEFAULT_N_BOOT, DEFAULT_SEED)
            cells = []
            for j, rel in enumerate((0.5, -0.5, 0.0)):
                diff, counts, truth = model.draw_paired(np.random.default_rng(seed + 10 * C + j), reps, C, k, rel_diff=rel)
                iv = intervals(W, diff, counts)
                if j == 0:
                    check_vectorized(W, diff, counts, iv)
                if rel:
                    margin = abs(truth)
                    eq = np.array([verdict(list(x), margin) == "equivalent" for x in iv])
                    cells += [f"{rate(eq)} ({band(eq)})"]
                else:
                    a_better, b_better = iv[:, 1] < 0.0, iv[:, 0] > 0.0
                    cells += [f"{rate(a_better)} ({band(a_better)})", f"{rate(b_better)} ({band(b_better)})"]
            yield (f"| {model.name} | {C} | {reps} | {' | '.join(cells)} |")


def two_windows(model: ClusterModel, rng: np.random.Generator, C: int, k: int, rel: tuple[object, object],
                reps: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Two candidates on the same positions at the base window (whole contexts) and at ``n_ctx/2`` (their second
    halves): a's KLD is ``1 + rel[h]`` times b's on half ``h`` (a number, or one per data set). Per window: a's and
    b's per-cluster KLD sums ``[C, reps]`` and the positions ``[C]``."""
    half = replace(model, positions=model.positions // 2)
    shape = (C, k, reps)
    common = model.cluster_multipliers(rng, (C, 1, reps)) * rng.lognormal(-0.5 * model.sigma_context**2,
                                                                            model.sigma_context, shape)
    scale = model.mean * half.positions
    a, b = [], []
    for h in range(2):
        a.append(scale * ((1.0 + np.asarray(rel[h])) * common * half.context_means(rng, shape)).sum(axis=1))
        b.append(scale * (common * half.context_means(rng, shape)).sum(axis=1))
    n2 = np.full(C, float(half.positions * k))
    return [(a[0] + a[1], b[0] + b[1], 2.0 * n2), (a[1], b[1], n2)]


def window_rows(reps: int, seed: int) -> Iterator[str]:
    """Two candidates on the same positions, rescored from the middle of each context (window ``n_ctx/2``): a's KLD
    is 1.5x b's on the first half and equal on the second, so the true order is "b lower" at the base window and a
    tie at the half window; a failure is both paired intervals excluding 0, on opposite sides (and the mirror)."""
    for model in MODELS:
        for C, k in LAYOUTS:
            W = draw_cluster_weights(C, DEFAULT_N_BOOT, DEFAULT_SEED)
            out = []
            for j, rel in enumerate((0.5, -0.5)):  # base order b lower (a's upper end at the half window), mirror
                (a0, b0, n0), (a1, b1, n1) = two_windows(model, np.random.default_rng(seed + 10 * C + j), C, k, (rel, 0.0), reps)
                base, late = intervals(W, a0 - b0, n0), intervals(W, a1 - b1, n1)
                order_base = np.where(base[:, 1] < 0, -1, np.where(base[:, 0] > 0, 1, 0))
                order_late = np.where(late[:, 1] < 0, -1, np.where(late[:, 0] > 0, 1, 0))
                out.append(order_base * order_late == -1)
            yield (f"| {model.name} | {C} | {reps} | {rate(out[0])} ({band(out[0])}) | {rate(out[1])} ({band(out[1])}) |")


def _summary(sums: np.ndarray, counts: np.ndarray) -> WindowSummary:
    """A :func:`harness.reports.windows.window_summary` of one candidate's per-cluster sums (what its reader keeps)."""
    C = counts.shape[0]
    return {"score_from": 0, "n_positions": int(counts.sum()), "n_contexts": C, "mean_kld": float(sums.sum() / counts.sum()),
            "ci95": None, "clusters": {"names": [f"c{c}" for c in range(C)], "sum_kld": sums.tolist(),
                                       "positions": counts.tolist(), "n_boot": DEFAULT_N_BOOT, "seed": DEFAULT_SEED}}


def reversal_rows(reps: int, seed: int) -> Iterator[str]:
    """``window.md``'s power statement: per data set, :func:`harness.reports.windows.detectable_reversal` (the
    smallest reversal ``rho`` flagged with 80 % power, from that data set's own draws); a fresh data set with the
    true reversal ``+rho`` x the pair's mean at the base window and ``-rho`` x it at ``n_ctx/2`` is flagged (both
    paired intervals exclude 0, on opposite sides) in the share printed, 80 % promised."""
    for model in MODELS:
        for C, k in LAYOUTS[:3]:
            W = draw_cluster_weights(C, DEFAULT_N_BOOT, DEFAULT_SEED)
            # true relative differences per half for a reversal rho: base (mean of the halves) +rho, late -rho, each
            # relative to the pair's mean at that window
            def halves(rho: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                base, late = rho / (1.0 - rho / 2.0), -rho / (1.0 + rho / 2.0)
                return 2.0 * base - late, late
            (a0, b0, n0), (a1, b1, n1) = two_windows(model, np.random.default_rng(seed + 10 * C), C, k,
                                                     halves(np.full(reps, 0.1)), reps)
            rhos = np.array([detectable_reversal(_summary(a0[:, j], n0), _summary(b0[:, j], n0), _summary(a1[:, j], n1),
                                                 _summary(b1[:, j], n1)) or math.nan for j in range(reps)])
            ok = np.isfinite(rhos)
            (a0, b0, n0), (a1, b1, n1) = two_windows(model, np.random.default_rng(seed + 10 * C + 1), C, k,
                                                     halves(np.where(ok, rhos, 0.0)), reps)
            base, late = intervals(W, a0 - b0, n0), intervals(W, a1 - b1, n1)
            hit = ((base[:, 0] > 0) & (late[:, 1] < 0))[ok]
            yield (f"| {model.name} | {C} | {reps} | {float(np.median(rhos[ok])):.3f} | {int((~ok).sum())} | 80 % | "
                   f"{rate(hit)} |")


def plan_rows(reps: int, seed: int) -> Iterator[str]:
    """Per data set, ``fidelity plan``'s "known within ±eps" from that data set's own clusters against the interval
    its report prints (median ratio of each printed arm to eps); and per data set its paired "resolves δ" (80 %
    power) against a fresh data set at a true difference δ: the share whose paired interval excludes 0 on the side
    of δ (the verdict "A/B better")."""
    for model in MODELS:
        for C, k in LAYOUTS:
            W = draw_cluster_weights(C, DEFAULT_N_BOOT, DEFAULT_SEED)
            sums, counts = model.draw(np.random.default_rng(seed + 10 * C), reps, C, k)
            iv = intervals(W, sums, counts, bounds=(0.0, math.inf))
            r = sums.sum(axis=0) / counts.sum()
            eps = np.array([achievable_eps(ClusterPilot(sums[:, j], counts, np.full(C, float(k)))) for j in range(reps)])
            up, down = (iv[:, 1] - r) / (eps * r), (r - iv[:, 0]) / (eps * r)
            # each data set's own pilot (a paired suite of C clusters) plans its delta; a fresh suite at that delta
            # (then at minus it) is scored: the share resolved is the power the plan promised. The pilots' true
            # difference is their median planned delta (its spread depends on it: three rounds from 10 % of the mean)
            powers, planned = [], []
            for j, sign in enumerate((1.0, -1.0)):
                rel = 0.1 * sign
                for _ in range(3):
                    pd, pc, _t = model.draw_paired(np.random.default_rng(seed + 10 * C + 4 + j), reps, C, k, rel_diff=rel)
                    deltas = np.array([resolvable_delta(diff_pilot(pd[:, i], pc, k))
                                       for i in range(reps)])
                    rel = sign * float(np.median(deltas)) / model.mean
                diff, dc, _t = model.draw_paired(np.random.default_rng(seed + 10 * C + 6 + j), reps, C, k,
                                                 rel_diff=sign * deltas / model.mean)  # type: ignore[arg-type]
                div = intervals(W, diff, dc)
                powers.append(div[:, 0] > 0.0 if sign > 0 else div[:, 1] < 0.0)
                planned.append(float(np.median(deltas)))
            yield (f"| {model.name} | {C} | {reps} | {np.median(up):.2f} | {np.median(down):.2f} | "
                        f"{100 * float(np.mean(iv[:, 1] - r <= eps * r)):.1f} % | {planned[0]:.3g} / {planned[1]:.3g} | 80 % | "
                        f"{rate(powers[0])} | {rate(powers[1])} |")


def main(reps: int, parts: str, models: str) -> None:
    global MODELS
    if models:
        MODELS = tuple(m for m in MODELS if any(s in m.name for s in models.split(",")))
    where = os.path.dirname(harness.__file__)
    head = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "--", "."], capture_output=True, text=True).stdout.strip()
    head += " + uncommitted changes" if dirty else ""
    print(f"# interval consumers: {reps} data sets per cell; code {head or '?'}, harness at {harness.__file__}; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    todo = parts.split(",") if parts else ["adaptive", "paired", "windows", "reversal", "plan"]
    if "adaptive" in todo:
        print("\n| model | clusters | contexts | shards | data sets | early wrong pass | early wrong fail |")
        print("|---|---|---|---|---|---|---|")
        for model in MODELS:
            for C, k, looks in ADAPTIVE_LAYOUTS:
                n = reps if C < 100 else max(reps // 2, 100)
                wp, wf = adaptive(model, C, k, looks, n, SEED0 + C)
                print(f"| {model.name} | {C} | {C * k} | {looks} | {n} | {rate(wp)} ({band(wp)}) | {rate(wf)} ({band(wf)}) |",
                      flush=True)
    if "paired" in todo:
        print("\n| model | clusters | data sets | \"equivalent\" at +margin | at -margin | \"A better\" at 0 | \"B better\" at 0 |")
        print("|---|---|---|---|---|---|---|")
        for row in paired_rows(reps, SEED0 + 20_000):
            print(row, flush=True)
    if "windows" in todo:
        print("\n| model | clusters | data sets | false flip failure (a's upper end) | mirror (a's lower end) |")
        print("|---|---|---|---|---|")
        for row in window_rows(reps, SEED0 + 40_000):
            print(row, flush=True)
    if "reversal" in todo:
        print("\n| model | clusters | data sets | window.md's smallest reversal (median, x mean) | not detectable | "
              "promised power | realised |")
        print("|---|---|---|---|---|---|---|")
        for row in reversal_rows(reps, SEED0 + 80_000):
            print(row, flush=True)
    if "plan" in todo:
        print("\n| model | clusters | data sets | printed upper arm / plan's eps (median) | lower arm / eps | upper arms "
              "within eps | plan's δ at + / - (median) | predicted power | realised at +δ (\"B better\") | at -δ (\"A better\") |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for row in plan_rows(reps, SEED0 + 60_000):
            print(row, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, sys.argv[2] if len(sys.argv) > 2 else "",
         sys.argv[3] if len(sys.argv) > 3 else "")
