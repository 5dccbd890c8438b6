"""Figures (matplotlib, Agg backend, imported lazily): the tail CCDF and KLD versus size.

Both are written atomically as PNG (render to memory, then :func:`harness.io.atomic.atomic_write_bytes`)
with fixed metadata, so the same numbers give the same bytes; a figure whose inputs are unchanged is read back
where results are kept (:mod:`harness.io.kept`; docs/performance.md, "Reruns").
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from harness.errors import VerificationError
from harness.io.atomic import atomic_write_bytes
from harness.io.figure import png_bytes
from harness.io.kept import kept
from harness.reports.units import GIB, axis_unit

if TYPE_CHECKING:
    from types import ModuleType

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Annotation
    from matplotlib.transforms import Bbox

#: A colour as matplotlib's colormaps return it (red, green, blue, alpha in [0, 1]).
Color = tuple[float, float, float, float]

class Ccdf(TypedDict):
    """The complementary CDF: histogram edges ``x`` and the fraction of positions with KLD >= x, ``y``."""

    x: list[float]
    y: list[float]


class SizePoint(TypedDict):
    """A point of the KLD-versus-size figure: a candidate's mean KLD, its 95% interval (None: not estimable),
    its on-disk size in GiB (None: unknown), and where known its whole-checkpoint bits per weight and parameter
    count."""

    candidate: str
    size_gib: float | None
    mean_kld: float
    ci95: list[float] | None
    bpw: NotRequired[float | None]
    params: NotRequired[int | None]


class PublishedPoint(SizePoint):
    """A point of a published set's ``kld-vs-size.json``: a :class:`SizePoint` with the on-disk bytes, the bits
    per weight of the quantized linears, and whether it is on the Pareto frontier."""

    size_bytes: int | None
    linear_bpw: float | None
    pareto: bool


class FloorBand(TypedDict):
    """What the figure draws of a precision floor (``fidelity.precision-floor/1``'s ``kld`` block)."""

    mean: float
    ci95: list[float] | None


class _Placed(TypedDict):
    """A point as drawn: its candidate, x on the figure's axis, mean KLD and interval."""

    candidate: str
    x: float
    mean_kld: float
    ci95: list[float] | None


def _kept_png(name: str, inputs: dict[str, object], render: Callable[[], bytes]) -> bytes:
    """``render()``, or the PNG kept for the same inputs, matplotlib version and plotting code
    (:func:`harness.io.kept.kept`; matplotlib draws the same inputs to the same bytes)."""
    from importlib import metadata

    doc = kept(f"figure-{name}", {**inputs, "matplotlib": metadata.version("matplotlib")}, [__file__],
               lambda: {"png_base64": base64.b64encode(render()).decode("ascii")})
    text = doc.get("png_base64")
    png = base64.b64decode(text) if isinstance(text, str) else b""
    if not png.startswith(b"\x89PNG"):
        raise VerificationError(f"figure {name}", "kept figure", "PNG bytes", f"{len(png)} bytes")
    return png


def _plt() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path) -> None:
    atomic_write_bytes(path, png_bytes(fig, dpi=120))


def candidate_colors(names: Sequence[str], palette_names: Sequence[str] | None = None) -> dict[str, Color]:
    """One colour per candidate: its place among the sorted ``palette_names`` (the configuration's candidates)
    and ``names``, on tab10 (tab20 beyond 10). Figures given the same ``palette_names`` colour a candidate alike
    whichever subset each shows (the tail plot of one run, the KLD-versus-size plot of a published set)."""
    import matplotlib

    universe = sorted(set(names) | set(palette_names or ()))
    cmap = matplotlib.colormaps["tab20" if len(universe) > 10 else "tab10"]
    return {n: cmap(i % cmap.N) for i, n in enumerate(universe) if n in set(names)}


def plot_ccdf(curves: Mapping[str, Ccdf], path: str | Path,
              palette_names: Sequence[str] | None = None) -> Path:
    """KLD complementary CDF, log-log, one step curve per candidate: ``curves[name] = {"x": edges, "y": P(KLD >= x)}``;
    colours by :func:`candidate_colors` with ``palette_names``."""
    path = Path(path)
    atomic_write_bytes(path, render_ccdf(curves, palette_names))
    return path


def render_ccdf(curves: Mapping[str, Ccdf], palette_names: Sequence[str] | None = None) -> bytes:
    """The PNG bytes of :func:`plot_ccdf`'s figure (rendered in memory, written by the caller)."""
    return _kept_png("ccdf", {"curves": curves, "palette": list(palette_names or ())},
                     lambda: _render_ccdf(curves, palette_names))


def _render_ccdf(curves: Mapping[str, Ccdf], palette_names: Sequence[str] | None) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    def median_x(item: tuple[str, Ccdf]) -> tuple[float, str]:
        xs = [x for x, y in zip(item[1]["x"], item[1]["y"]) if y <= 0.5]
        return (xs[0] if xs else float("inf"), item[0])

    colors = candidate_colors(list(curves), palette_names)
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
    return png_bytes(fig, dpi=120)


def pareto_front(points: Sequence[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Points not dominated by another (smaller or equal size *and* smaller or equal KLD, one strictly)."""
    front: list[tuple[float, float, str]] = []
    for x, y, n in sorted(points, key=lambda p: (p[0], p[1])):
        if not front or y < front[-1][1]:
            front.append((x, y, n))
    return front


def _label_text(p: _Placed) -> str:
    """``name mean [-a%, +b%]``: the 95% interval's ends relative to the mean, when estimable (printed as an
    interval: it is seldom symmetric)."""
    ci = p["ci95"]
    rel = "" if ci is None else (f" [{100.0 * (ci[0] / p['mean_kld'] - 1.0):+.1f}%, "
                                 f"{100.0 * (ci[1] / p['mean_kld'] - 1.0):+.1f}%]")
    return f"{p['candidate']} {p['mean_kld']:.3g}{rel}"


#: Label offsets tried in turn (points from the marker; the horizontal alignment follows the side).
#: Near the marker first; then farther up/down, then farther sideways (a crowded ladder: many
#: candidates of one size within a few % of each other).
_OFFSETS = [(dx, dy) for far in (False, True)
            for dy in (4, -12, 16, -24, 28, -36, 40, -48, 52, -60, 64, -72, 76, -84, 88, -96)
            for dx in ((60, -60) if far else (9, -9))]


def _moved(offset: tuple[int, int]) -> bool:
    """A label away from its marker (it gets a leader line)."""
    return abs(offset[1]) > 12 or abs(offset[0]) > 9


def place_labels(fig: Figure, ax: Axes, pts: Sequence[_Placed], scale: float,
                 colors: Mapping[str, Color]) -> list[Annotation]:
    """One label per point, each at the first offset where it overlaps no other label and no other marker
    and stays inside the axes; a label moved away from its marker gets a leader line in its colour, so
    near-identical points keep their own, readable labels. Returns the annotation artists."""
    fig.canvas.draw()  # text extents below are measured with the figure's renderer (Agg, drawn once)
    frame = ax.get_window_extent()
    centers = [ax.transData.transform((p["x"] * scale, p["mean_kld"])) for p in pts]
    r = 9.0  # a marker's half-size in pixels, with a margin
    placed: list[Bbox] = []
    texts: list[Annotation] = []

    def label(p: _Placed, offset: tuple[int, int], leader: bool) -> Annotation:
        arrow = ({"arrowstyle": "-", "color": colors[p["candidate"]], "linewidth": 0.8, "shrinkA": 0, "shrinkB": 5}
                 if leader else None)
        return ax.annotate(_label_text(p), (p["x"] * scale, p["mean_kld"]), textcoords="offset points",
                           xytext=offset, fontsize=8, ha="left" if offset[0] > 0 else "right", va="bottom",
                           arrowprops=arrow)

    order = sorted(range(len(pts)), key=lambda i: (pts[i]["x"], -pts[i]["mean_kld"], pts[i]["candidate"]))
    def text_box(p: _Placed, offset: tuple[int, int]) -> Bbox:
        """The label's text extent at ``offset``, in pixels (measured on a probe without a leader)."""
        t = label(p, offset, leader=False)
        box = t.get_window_extent()
        t.remove()
        return box

    for i in order:
        chosen, chosen_box = _OFFSETS[0], None
        for offset in _OFFSETS:
            box = text_box(pts[i], offset)
            clash = any(box.overlaps(b) for b in placed) or any(
                j != i and box.x0 - r < cx < box.x1 + r and box.y0 - r < cy < box.y1 + r
                for j, (cx, cy) in enumerate(centers))
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if not clash and inside:
                chosen, chosen_box = offset, box
                break
        placed.append(chosen_box if chosen_box is not None else text_box(pts[i], chosen))
        texts.append(label(pts[i], chosen, leader=_moved(chosen)))
    return texts


def plot_kld_vs_size(points: Sequence[SizePoint], path: str | Path,
                     palette_names: Sequence[str] | None = None, floor: FloorBand | None = None) -> Path:
    """Write :func:`kld_vs_size_figure` as a PNG at ``path``."""
    fig, _axes, _labels = kld_vs_size_figure(points, palette_names, floor)
    path = Path(path)
    _save(fig, path)
    return path


def _x_axis(pts: Sequence[SizePoint]) -> tuple[str, float, str]:
    """``(point key, scale, label)`` of the x axis: whole-checkpoint bits per weight when every point has it,
    else the on-disk size in GiB or MiB."""
    if pts and all(p.get("bpw") is not None for p in pts):
        return "bpw", 1.0, "bits per weight, whole checkpoint (stored tensor bits / parameters)"
    divisor, unit = axis_unit(max(((p["size_gib"] or 0.0) * GIB for p in pts), default=GIB))
    return "size_gib", GIB / divisor, f"on-disk size ({unit})"


def _x(p: SizePoint, key: str) -> float:
    """The point's value on the x axis chosen by :func:`_x_axis` (``bpw`` or ``size_gib``, which every point
    shown has)."""
    value = p.get("bpw") if key == "bpw" else p["size_gib"]
    return 0.0 if value is None else float(value)


def kld_vs_size_figure(points: Sequence[SizePoint], palette_names: Sequence[str] | None = None,
                       floor: FloorBand | None = None) -> tuple[Figure, tuple[Axes, Axes], list[Annotation]]:
    """The figure ``(fig, (main axes, relative-interval axes), point labels)``: mean KLD (log y, 95% interval bars)
    versus bits per weight, points labelled, Pareto frontier drawn; below it, each candidate's 95% interval
    relative to its mean (%), where bars a few % wide are visible.

    ``points``: dicts with ``candidate``, ``size_gib``, ``mean_kld``, ``ci95`` and ``bpw`` (whole-checkpoint bits
    per weight). The x axis is ``bpw`` when every point has it, with the on-disk size on a second axis (drawn
    when every point has one parameter count, ``params``: bytes = bpw x params / 8); else the size in GiB, or MiB
    when every candidate is under 1 GiB. ``floor`` (``mean``, ``ci95``): the reference's precision floor, drawn
    as a band. Colours are the candidates' colours of every figure of the set (:func:`candidate_colors`).
    """
    plt = _plt()
    fig, (ax, rel) = plt.subplots(2, 1, figsize=(8, 8), gridspec_kw={"height_ratios": [3.0, 1.35]})
    shown = [p for p in points if p.get("size_gib") is not None and p["mean_kld"] > 0]
    key, scale, xlabel = _x_axis(shown)
    pts: list[_Placed] = [{"candidate": p["candidate"], "x": _x(p, key) * scale, "mean_kld": p["mean_kld"],
                           "ci95": p["ci95"]} for p in shown]
    front = pareto_front([(p["x"], p["mean_kld"], p["candidate"]) for p in pts])
    colors = candidate_colors([p["candidate"] for p in pts], palette_names)  # the same colours as the tail plot
    if len(front) > 1:  # a frontier of one point is no line
        ax.plot([f[0] for f in front], [f[1] for f in front], "--", color="0.35", linewidth=1.2,
                label="Pareto frontier (no other candidate is both smaller and closer)", zorder=1)
    if floor is not None:
        lo_f, hi_f = floor.get("ci95") or (floor["mean"], floor["mean"])
        ax.axhspan(lo_f, hi_f, color="0.75", alpha=0.5, zorder=0,
                   label=f"precision floor {floor['mean']:.3g} (bf16 execution of the reference vs float64)")
        ax.axhline(floor["mean"], color="0.45", linewidth=0.9, zorder=0)
    for p in pts:
        lo, hi = p["ci95"] or (p["mean_kld"], p["mean_kld"])  # no bar when not estimable
        x, y = p["x"], p["mean_kld"]
        color = colors[p["candidate"]]
        # the interval is often a few % of the mean, narrower than a marker on a log axis: the marker is
        # hollow, the caps wide, and the panel below shows the interval to scale
        ax.errorbar([x], [y], yerr=[[max(y - lo, 0.0)], [max(hi - y, 0.0)]], fmt="o", mfc="none", color=color,
                    ecolor=color, elinewidth=2.2, capsize=7, capthick=1.6, markersize=7, zorder=3)
    if len(front) > 1 or floor is not None:
        ax.legend(loc="upper right", fontsize=9)
    ax.set_yscale("log")
    ax.ticklabel_format(axis="x", useOffset=False, style="plain")
    ax.set_xlabel(xlabel)
    params = {p.get("params") for p in shown}
    if key == "bpw" and len(params) == 1 and (count := params.pop()) is not None:
        n = float(count)
        divisor, unit = axis_unit(max(p["x"] for p in pts) * n / 8.0)
        top = ax.secondary_xaxis("top", functions=(lambda b: b * n / 8.0 / divisor, lambda s: s * divisor * 8.0 / n))
        top.set_xlabel(f"stored tensor bytes ({unit})")
    ax.set_ylabel("mean KLD vs BF16 (nats, log scale)")
    ax.set_title("Fidelity versus bits per weight (bars: 95% interval of the mean)" if key == "bpw"
                 else "Fidelity versus size (bars: 95% interval of the mean)")
    ax.grid(True, which="both", alpha=0.3)
    if pts:
        xs = [p["x"] for p in pts]
        span = (max(xs) - min(xs)) or max(xs) or 1.0
        ax.set_xlim(min(xs) - 0.08 * span, max(xs) + 0.3 * span)
        ys = [v for p in pts for v in (*(p["ci95"] or ()), p["mean_kld"]) if v > 0]
        if floor is not None:
            ys += [v for v in (floor["mean"], *(floor.get("ci95") or ())) if v > 0]
        ax.set_ylim(min(ys) / 2.0, max(ys) * 3.0)
    _relative_intervals(rel, pts, colors)
    fig.tight_layout()
    return fig, (ax, rel), place_labels(fig, ax, pts, 1.0, colors)


def _relative_intervals(ax: Axes, pts: Sequence[_Placed], colors: Mapping[str, Color]) -> None:
    """Each candidate's 95% interval as % of its mean (closest candidate on top), to scale."""
    order = sorted(pts, key=lambda p: (p["mean_kld"], p["candidate"]))
    for row, p in enumerate(order):
        y = len(order) - 1 - row
        ci = p["ci95"]
        color = colors[p["candidate"]]
        if ci is None:
            ax.text(0.0, y, "not estimable", ha="center", va="center", fontsize=8, color=color)
            continue
        lo, hi = (100.0 * (ci[0] / p["mean_kld"] - 1.0), 100.0 * (ci[1] / p["mean_kld"] - 1.0))
        ax.errorbar([0.0], [y], xerr=[[-lo], [hi]], fmt="|", color=color, ecolor=color, elinewidth=2.2, capsize=4,
                    markersize=9)
    ax.set_yticks(range(len(order)), [p["candidate"] for p in reversed(order)], fontsize=8)
    ax.axvline(0.0, color="0.6", linewidth=0.8)
    ax.set_xlabel("95% interval of the mean KLD, relative to the mean (%)")
    ax.grid(True, axis="x", alpha=0.3)
    if order:
        ax.set_ylim(-0.7, len(order) - 0.3)
