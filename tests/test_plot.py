"""The KLD-versus-size figure: every point keeps its own readable label, intervals are visible to scale,
and a candidate has the same colour in both figures of a report set."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from harness.reports.plot import candidate_colors, kld_vs_size_figure

MIB = 1 / 1024  # GiB

# Shaped like the embedded default's ladder: two pairs of near-identical points (same size, means 2-10% apart).
POINTS = [
    {"candidate": "int8", "size_gib": 1.77 * MIB, "mean_kld": 1.161e-4, "ci95": [1.129e-4, 1.200e-4]},
    {"candidate": "fp8_e4m3", "size_gib": 1.77 * MIB, "mean_kld": 5.513e-4, "ci95": [5.328e-4, 5.918e-4]},
    {"candidate": "int4_g32_b", "size_gib": 1.48 * MIB, "mean_kld": 4.261e-3, "ci95": [4.129e-3, 4.437e-3]},
    {"candidate": "nvfp4", "size_gib": 1.44 * MIB, "mean_kld": 6.390e-3, "ci95": [6.223e-3, 6.606e-3]},
    {"candidate": "int4_g32", "size_gib": 1.43 * MIB, "mean_kld": 7.118e-3, "ci95": [6.863e-3, 7.465e-3]},
    {"candidate": "int4_g32_sr1", "size_gib": 1.43 * MIB, "mean_kld": 0.0132, "ci95": [0.0127, 0.0140]},
    {"candidate": "int4_g32_sr2", "size_gib": 1.43 * MIB, "mean_kld": 0.0135, "ci95": [0.0130, 0.0142]},
    {"candidate": "int3_g32", "size_gib": 1.34 * MIB, "mean_kld": 0.0383, "ci95": [0.0371, 0.0400]},
]

# The embedded default's ladder with its compressed-tensors candidates: six points within 3% of one
# size, four of them with means within 11% of each other.
CROWDED = [
    {"candidate": "int3_g32", "size_gib": 0.0013077, "mean_kld": 0.03832, "ci95": [0.03712, 0.04000]},
    {"candidate": "int4_g32", "size_gib": 0.0013992, "mean_kld": 0.007118, "ci95": [0.006863, 0.007465]},
    {"candidate": "int4_g32_sr1", "size_gib": 0.0013992, "mean_kld": 0.01322, "ci95": [0.01274, 0.01396]},
    {"candidate": "int4_g32_sr2", "size_gib": 0.0013992, "mean_kld": 0.01346, "ci95": [0.01299, 0.01424]},
    {"candidate": "ct_nv_fp4a16.hf", "size_gib": 0.0014016, "mean_kld": 0.006666, "ci95": [0.006438, 0.006949]},
    {"candidate": "ct_w4a16_gptq.hf", "size_gib": 0.0014017, "mean_kld": 0.002357, "ci95": [0.002265, 0.002490]},
    {"candidate": "ct_w4a16_rtn.hf", "size_gib": 0.0014017, "mean_kld": 0.006985, "ci95": [0.006769, 0.007233]},
    {"candidate": "nvfp4", "size_gib": 0.0014018, "mean_kld": 0.006390, "ci95": [0.006223, 0.006606]},
    {"candidate": "int4_g32_b", "size_gib": 0.0014477, "mean_kld": 0.004261, "ci95": [0.004129, 0.004437]},
    {"candidate": "ct_fp8_dynamic.hf", "size_gib": 0.0017287, "mean_kld": 0.001414, "ci95": [0.001372, 0.001496]},
    {"candidate": "fp8_e4m3", "size_gib": 0.0017292, "mean_kld": 0.0005513, "ci95": [0.0005328, 0.0005918]},
    {"candidate": "int8", "size_gib": 0.0017292, "mean_kld": 0.0001161, "ci95": [0.0001129, 0.0001200]},
]


@pytest.fixture(scope="module", params=["ladder", "crowded"])
def figure(request: pytest.FixtureRequest) -> Any:
    points = POINTS if request.param == "ladder" else CROWDED
    fig, axes, labels = kld_vs_size_figure(points)
    fig.canvas.draw()  # text extents are in pixels only once drawn
    yield fig, axes, labels, points
    import matplotlib.pyplot as plt

    plt.close(fig)


def label_box(annotation: Any, renderer: Any) -> Any:
    """The bounding box of an annotation's text alone (without its leader line)."""
    from matplotlib.text import Text

    return Text.get_window_extent(annotation, renderer)


def test_every_point_has_its_own_label_inside_the_axes_and_none_overlap(figure: Any) -> None:
    fig, (ax, _rel), labels, points = figure
    renderer = fig.canvas.get_renderer()
    assert sorted(t.get_text().split()[0] for t in labels) == sorted(p["candidate"] for p in points)
    boxes = [label_box(t, renderer) for t in labels]
    frame = ax.get_window_extent(renderer)
    for a, b in itertools.combinations(range(len(boxes)), 2):
        assert not boxes[a].overlaps(boxes[b]), (labels[a].get_text(), labels[b].get_text())
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
    assert "MiB" in ax.get_xlabel()  # every candidate under 1 GiB: the axis is in MiB, as in the ladder


def test_the_relative_panel_shows_each_interval_to_scale_and_visible(figure: Any) -> None:
    fig, (_ax, rel), _labels, points = figure
    renderer = fig.canvas.get_renderer()
    xlo, xhi = rel.get_xlim()
    px_per_pct = rel.get_window_extent(renderer).width / (xhi - xlo)
    for p in points:
        width_pct = 100.0 * (p["ci95"][1] - p["ci95"][0]) / p["mean_kld"]
        assert width_pct * px_per_pct > 40  # tens of pixels, not hidden under a marker
        assert xlo < 100.0 * (p["ci95"][0] / p["mean_kld"] - 1) and 100.0 * (p["ci95"][1] / p["mean_kld"] - 1) < xhi
    assert [t.get_text() for t in rel.get_yticklabels()][::-1] == \
        [p["candidate"] for p in sorted(points, key=lambda p: p["mean_kld"])]


def test_a_candidate_has_one_colour_in_both_figures(figure: Any) -> None:
    """The tail figure colours by :func:`candidate_colors` of its names; so does this one, whatever order
    or subset of other candidates each figure gets."""
    fig, (ax, rel), _labels, points = figure
    colors = candidate_colors([p["candidate"] for p in points])
    drawn = {line.get_color() if isinstance(line.get_color(), str) else tuple(line.get_color())
             for line in ax.get_lines() if line.get_linestyle() == "None"}
    assert drawn == {tuple(c) for c in colors.values()}
    assert candidate_colors([p["candidate"] for p in reversed(points)]) == colors


@pytest.mark.parametrize(("n_bytes", "ladder", "page", "axis"), [
    (1_856_707, "1.77 MiB", "1.771 MiB (1856707 bytes)", "MiB"),
    (700 * 2**20, "700.00 MiB", "700.000 MiB (734003200 bytes)", "MiB"),
    (2**30, "1.00 GiB", "1.000 GiB (1073741824 bytes)", "GiB"),
    (16_060_000_000, "14.96 GiB", "14.957 GiB (16060000000 bytes)", "GiB"),
])
def test_one_size_unit_in_the_ladder_the_pages_and_the_plot(n_bytes: int, ladder: str, page: str, axis: str) -> None:
    """A size reads in the same unit everywhere a report set shows it (GiB from 1 GiB, else MiB)."""
    from harness.reports.aggregate import format_ladder
    from harness.reports.report_set import page_size

    row = {"candidate": "c", "size_bytes": n_bytes, "shards": [0], "mean_kld": 0.01, "ci95": None,
           "p99_bounds": [0.0, 0.05], "top1": 0.9, "verdict": "pass"}
    assert f"| {ladder} |" in format_ladder([row])[2]
    assert page_size(n_bytes) == page
    fig, (ax, _rel), _labels = kld_vs_size_figure([{"candidate": "c", "size_gib": n_bytes / 2**30,
                                                    "mean_kld": 0.01, "ci95": None}])
    assert ax.get_xlabel() == f"on-disk size ({axis})"
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_a_subset_figure_colours_a_candidate_as_the_full_set_does(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of two candidates writes tails.png; the published set of all eight draws kld-vs-size.png. With the
    configuration's names as the palette, each candidate has one colour in both (without it, int8 would be
    the second colour in the first figure and the seventh in the second)."""
    import matplotlib.pyplot as plt

    # no kept results: a pytest-xdist worker of a run that collects fidelity.toml's cases keeps them in the
    # repository's cache for its whole session, and a figure kept by an earlier run would be read, not drawn
    monkeypatch.setattr("harness.io.kept._stores", [])

    from harness.reports.plot import plot_ccdf

    palette = [p["candidate"] for p in POINTS]
    subset = {"int8": {"x": [1e-4, 1e-3], "y": [1.0, 0.1]}, "int3_g32": {"x": [1e-2, 1e-1], "y": [1.0, 0.1]}}
    assert candidate_colors(list(subset))["int8"] != candidate_colors(palette)["int8"]  # the problem it solves
    fig_full, (ax_full, _rel), _labels = kld_vs_size_figure(POINTS, palette)
    drawn_full = {tuple(line.get_color()) for line in ax_full.get_lines() if line.get_linestyle() == "None"}
    plt.close(fig_full)
    captured: dict[str, Any] = {}
    real_step = plt.Axes.step

    def spy(self: Any, x: Any, y: Any, *args: Any, **kwargs: Any) -> Any:
        captured[kwargs["label"]] = tuple(kwargs["color"])
        return real_step(self, x, y, *args, **kwargs)

    monkey = pytest.MonkeyPatch()
    monkey.setattr(plt.Axes, "step", spy)
    try:
        plot_ccdf(subset, tmp_path / "tails.png", palette)
    finally:
        monkey.undo()
    want = candidate_colors(palette)
    assert captured == {n: tuple(want[n]) for n in subset}
    assert set(captured.values()) <= drawn_full
