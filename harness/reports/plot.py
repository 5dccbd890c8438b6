"""Figures (matplotlib, Agg backend, imported lazily): the tail CCDF and KLD versus size.

Both are written atomically as PNG (render to memory, then :func:`harness.io.atomic.atomic_write_bytes`)
with fixed metadata, so the same numbers give the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.io.atomic import atomic_write_bytes

_PNG_META = {"Software": None}  # no matplotlib version stamp: same figure, same bytes


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, metadata=_PNG_META)
    _plt().close(fig)
    atomic_write_bytes(path, buf.getvalue())


def candidate_colors(names: Sequence[str]) -> dict[str, Any]:
    """One colour per candidate, the same in every figure of a report set (sorted names on tab20)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20" if len(set(names)) > 10 else "tab10"]
    return {n: cmap(i % cmap.N) for i, n in enumerate(sorted(set(names)))}


def plot_ccdf(curves: Mapping[str, Mapping[str, Sequence[float]]], path: str | Path) -> Path:
    """KLD complementary CDF, log-log, one step curve per candidate: ``curves[name] = {"x": edges, "y": P(KLD >= x)}``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    def median_x(item: tuple[str, Mapping[str, Sequence[float]]]) -> tuple[float, str]:
        xs = [x for x, y in zip(item[1]["x"], item[1]["y"]) if y <= 0.5]
        return (xs[0] if xs else float("inf"), item[0])

    colors = candidate_colors(list(curves))
    for name, c in sorted(curves.items(), key=median_x):  # legend from the closest candidate to the farthest
        if c["x"]:
            ax.step(c["x"], c["y"], where="post", label=name, linewidth=1.6, color=colors[name])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("KLD threshold x (nats)")
    ax.set_ylabel("fraction of positions with KLD ≥ x")
    ax.set_title("KLD tail (complementary CDF) per candidate")
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.12)
    # x range: from a decade before the first drop below 1 to a decade past the largest value
    drops = [x for c in curves.values() for x, y in zip(c["x"], c["y"]) if y < 1.0]
    ends = [c["x"][-1] for c in curves.values() if c["x"]]
    if drops and ends:
        lo, hi = min(drops) / 10.0, max(ends) * 10.0
        ax.set_xlim(lo, hi)
        for t in (1e-4, 1e-3, 1e-2, 1e-1, 1.0):  # the exceedance thresholds of the reports
            if lo < t < hi:
                ax.axvline(t, color="0.6", linestyle=":", linewidth=0.8)
    ax.legend(loc="lower left", fontsize=9, frameon=True)
    fig.tight_layout()
    path = Path(path)
    _save(fig, path)
    return path


def pareto_front(points: Sequence[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Points not dominated by another (smaller or equal size *and* smaller or equal KLD, one strictly)."""
    front: list[tuple[float, float, str]] = []
    for x, y, n in sorted(points, key=lambda p: (p[0], p[1])):
        if not front or y < front[-1][1]:
            front.append((x, y, n))
    return front


def _labels(pts: Sequence[Mapping[str, Any]], scale: float) -> list[tuple[tuple[float, float], str, int]]:
    """One label per point (name, mean KLD and the interval's half-width); a label near an earlier one
    moves down a line, so near-identical points keep their own labels."""
    import math

    if not pts:
        return []
    xs = [p["size_gib"] * scale for p in pts]
    ys = [math.log10(p["mean_kld"]) for p in pts]
    sx = (max(xs) - min(xs)) or 1.0
    sy = (max(ys) - min(ys)) or 1.0
    out: list[tuple[tuple[float, float], str, int]] = []
    placed: list[tuple[float, float, int]] = []
    for i in sorted(range(len(pts)), key=lambda i: (xs[i], -ys[i], pts[i]["candidate"])):
        nx, ny = xs[i] / sx, ys[i] / sy
        k = sum(1 for px, py, _ in placed if abs(px - nx) < 0.12 and abs(py - ny) < 0.06)
        placed.append((nx, ny, k))
        ci = pts[i]["ci95"]
        half = "" if ci is None else f" ±{100.0 * (ci[1] - ci[0]) / 2.0 / pts[i]['mean_kld']:.1f}%"
        out.append(((xs[i], pts[i]["mean_kld"]), f"{pts[i]['candidate']} {pts[i]['mean_kld']:.3g}{half}", k))
    return out


def plot_kld_vs_size(points: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Mean KLD (log y, 95% interval bars) versus on-disk size, points labelled, Pareto frontier drawn.

    ``points``: dicts with ``candidate``, ``size_gib``, ``mean_kld``, ``ci95``. The axis is in GiB, or in
    MiB when every candidate is under 1 GiB (small test models), so the ticks stay readable.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    pts = [p for p in points if p.get("size_gib") is not None and p["mean_kld"] > 0]
    scale, unit = (1.0, "GiB") if not pts or max(p["size_gib"] for p in pts) >= 1.0 else (1024.0, "MiB")
    front = pareto_front([(p["size_gib"], p["mean_kld"], p["candidate"]) for p in pts])
    colors = candidate_colors([p["candidate"] for p in pts])  # the same colours as the tail plot
    if front:
        ax.plot([f[0] * scale for f in front], [f[1] for f in front], "--", color="0.35", linewidth=1.2,
                label="Pareto frontier (no other candidate is both smaller and closer)", zorder=1)
    for p in pts:
        lo, hi = p["ci95"] or (p["mean_kld"], p["mean_kld"])  # no bar when not estimable
        x, y = p["size_gib"] * scale, p["mean_kld"]
        color = colors[p["candidate"]]
        # the interval is often a few % of the mean: narrower than a marker on a log axis, so the marker is
        # hollow, the bar thick with wide caps, and the label states the half-width
        ax.errorbar([x], [y], yerr=[[max(y - lo, 0.0)], [max(hi - y, 0.0)]], fmt="o", mfc="none", color=color,
                    ecolor=color, elinewidth=2.2, capsize=7, capthick=1.6, markersize=7, zorder=3)
    for (x, y), text, k in _labels(pts, scale):
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(8, 4 - 12 * k), fontsize=8)
    if front:
        ax.legend(loc="upper right", fontsize=9)
    ax.set_yscale("log")
    ax.ticklabel_format(axis="x", useOffset=False, style="plain")
    ax.set_xlabel(f"on-disk size ({unit})")
    ax.set_ylabel("mean KLD vs BF16 (nats, log scale; bars and ±: 95% interval)")
    ax.set_title("Fidelity versus size")
    ax.grid(True, which="both", alpha=0.3)
    if pts:
        xs = [p["size_gib"] * scale for p in pts]
        span = (max(xs) - min(xs)) or max(xs) or 1.0
        ax.set_xlim(min(xs) - 0.08 * span, max(xs) + 0.25 * span)
        ys = [v for p in pts for v in (*(p["ci95"] or ()), p["mean_kld"]) if v > 0]
        ax.set_ylim(min(ys) / 2.0, max(ys) * 3.0)
    fig.tight_layout()
    path = Path(path)
    _save(fig, path)
    return path
