"""Scoring-window controls (``pytest -m window``): the same captures rescored from row ``k``.

A window ``score_from=k`` drops rows ``< k`` of every context before any statistic (docs/design.md
section 2); llama.cpp's ``llama-perplexity`` scores the second half of each chunk
(``k = n_ctx/2``). The controls rescore the *same* scored positions (no recapture, no GEMMs)
at ``k`` in :data:`WINDOWS` (0, 64 and n_ctx/2) and report, per candidate, the mean KLD, its
95% source-cluster interval, ``n_positions`` and the relative change against the run's base
window (``--fidelity-window``, default 0). Windows that leave no position
(``k > n_ctx - 2``) are skipped with a note.

Ranking rule (documented decision): the candidates are ranked by mean KLD at each window. A
pair whose order flips between the base window and ``k`` is

* a **failure** when their 95% intervals are disjoint at *both* windows: the order is real at
  each window and the window reverses it, so the ladder depends on the window;
* a **warning** otherwise: the intervals overlap, the two are indistinguishable at that window
  and their order is noise (siblings of one recipe flip freely).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SCHEMA = "fidelity.window/1"
WINDOWS = (0, 64, "half")


def planned_windows(n_ctx: int, base: int = 0) -> tuple[list[int], list[tuple[int, str]]]:
    """The windows to run, and ``(k, note)`` for each one skipped (``k > n_ctx - 2`` leaves no position)."""
    ks = sorted({base, *[(n_ctx // 2 if w == "half" else int(w)) for w in WINDOWS]})
    run: list[int] = []
    skipped: list[tuple[int, str]] = []
    for k in ks:
        if k > n_ctx - 2:
            skipped.append((k, f"score_from={k} skipped: contexts have n_ctx={n_ctx} tokens, rows 0..{n_ctx - 2}"))
        else:
            run.append(k)
    return run, skipped


def expected_positions(n_contexts: int, n_ctx: int, k: int) -> int:
    """Positions left by window ``k``: every context keeps rows ``k .. n_ctx-2``."""
    return n_contexts * max(0, n_ctx - 1 - k)


def window_summary(positions: Sequence[Any], k: int, *, n_boot: int, seed: int | None = None) -> dict[str, Any]:
    """Mean KLD, 95% source-cluster interval and counts of one candidate's positions at window ``k``.

    ``positions``: :class:`harness.run.shard.ShardPositions` of the selected shards."""
    from harness.metrics.bootstrap import (
        DEFAULT_SEED,
        draw_cluster_weights,
        percentile_interval,
        ratio_replicates,
    )
    from harness.metrics.positions import layout
    from harness.scoring.scores import PositionScores

    scores = PositionScores.concat([p.scores for p in positions])
    ctx = np.concatenate([p.context_index for p in positions])
    row = np.concatenate([p.row for p in positions])
    labels = [lab for p in positions for lab in p.labels]
    L = layout(scores, ctx, row, labels, k)
    C = L.n_clusters
    W = draw_cluster_weights(C, n_boot, DEFAULT_SEED if seed is None else seed)
    sums = np.bincount(L.cluster, weights=L.scores.kld, minlength=C)
    counts = np.bincount(L.cluster, minlength=C).astype(np.float64)
    return {
        "score_from": int(k),
        "n_positions": len(L.scores),
        "n_contexts": len(L.contexts),
        "mean_kld": float(L.scores.kld.mean()),
        "ci95": percentile_interval(ratio_replicates(W, sums, counts)),
    }


def _disjoint(a: Sequence[float], b: Sequence[float]) -> bool:
    return a[1] < b[0] or b[1] < a[0]


def compare_windows(base: int, by_window: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Relative changes and ranking flips against the base window.

    ``by_window[k][candidate]`` is a :func:`window_summary`. Returns the JSON-ready comparison with a
    ``verdict`` line, per window ``flips`` (``failures`` and ``warnings``)."""
    ref = by_window[base]
    rank0 = sorted(ref, key=lambda c: (ref[c]["mean_kld"], c))
    out: dict[str, Any] = {"schema": SCHEMA, "base_window": base, "ranking_base": rank0, "windows": {}}
    n_fail = n_warn = 0
    for k in sorted(by_window):
        cur = by_window[k]
        rank = sorted(cur, key=lambda c: (cur[c]["mean_kld"], c))
        failures: list[list[str]] = []
        warnings: list[list[str]] = []
        for i, a in enumerate(rank0):
            for b in rank0[i + 1 :]:
                if a in cur and b in cur and rank.index(a) > rank.index(b):
                    real = _disjoint(ref[a]["ci95"], ref[b]["ci95"]) and _disjoint(cur[a]["ci95"], cur[b]["ci95"])
                    (failures if real else warnings).append([a, b])
        n_fail += len(failures)
        n_warn += len(warnings)
        out["windows"][str(k)] = {
            "ranking": rank,
            "candidates": {
                c: {**cur[c], "rel_change_mean_kld": (cur[c]["mean_kld"] / ref[c]["mean_kld"] - 1.0) if ref[c]["mean_kld"] else None}
                for c in sorted(cur)
            },
            "flips": {"failures": failures, "warnings": warnings},
        }
    if n_fail:
        verdict = f"ranking CHANGES with the window ({n_fail} flip(s) with disjoint intervals)"
    elif n_warn:
        verdict = f"ranking stable within noise ({n_warn} flip(s) between candidates whose intervals overlap)"
    else:
        verdict = "ranking stable across windows"
    out["verdict"] = verdict
    return out


def flip_message(k: int, base: int, flips: Sequence[Sequence[str]]) -> str:
    """The failure text naming the candidates whose order flipped."""
    pairs = ", ".join(f"{a} < {b} at score_from={base} but {b} < {a} at score_from={k}" for a, b in flips)
    return f"ranking flips with disjoint 95% intervals: {pairs}"


def render_window(cmp: Mapping[str, Any], notes: Sequence[str] = ()) -> str:
    """``window.md``: per window, each candidate's mean KLD, interval, positions and relative change."""
    from harness.reports.numbers import fmt_g

    lines = ["# Scoring-window control", "", f"**Verdict: {cmp['verdict']}.**", "",
             f"Base window score_from={cmp['base_window']}; the same scored positions are summarized again "
             "from row k (no recapture). Flips between candidates whose 95% intervals are disjoint at both "
             "windows fail; flips within overlapping intervals are warnings.", ""]
    lines += ["| score_from | candidate | positions | mean KLD | 95% interval | change vs base |", "|---|---|---|---|---|---|"]
    for k, w in sorted(cmp["windows"].items(), key=lambda t: int(t[0])):
        for c in w["ranking"]:
            d = w["candidates"][c]
            rel = "—" if d["rel_change_mean_kld"] is None else f"{100 * d['rel_change_mean_kld']:+.1f}%"
            lines.append(f"| {k} | {c} | {d['n_positions']} | {fmt_g(d['mean_kld'])} | [{fmt_g(d['ci95'][0])}, {fmt_g(d['ci95'][1])}] | {rel} |")
    lines.append("")
    for k, w in sorted(cmp["windows"].items(), key=lambda t: int(t[0])):
        for a, b in w["flips"]["failures"]:
            lines.append(f"- FLIP at score_from={k}: {a} and {b} (disjoint intervals)")
        for a, b in w["flips"]["warnings"]:
            lines.append(f"- flip within noise at score_from={k}: {a} and {b}")
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def merge_window_payloads(payloads: Sequence[Mapping[str, Any]]) -> tuple[int, dict[int, dict[str, Any]], list[str]]:
    """Combine the window cases' payloads (``base``, ``k``, ``summaries``, ``base_summaries``, ``notes``)."""
    by_window: dict[int, dict[str, Any]] = {}
    notes: list[str] = []
    base = int(payloads[0]["base"])
    for p in payloads:
        by_window.setdefault(int(p["k"]), {}).update(p["summaries"])
        by_window.setdefault(base, {}).update(p["base_summaries"])
        for n in p.get("notes", []):
            if n not in notes:
                notes.append(n)
    return base, by_window, notes


def write_window(out_dir: Any, payloads: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Write ``window.json`` and ``window.md``; returns the comparison."""
    from pathlib import Path

    from harness.io.atomic import atomic_write_files, dumps_json

    base, by_window, notes = merge_window_payloads(payloads)
    cmp = compare_windows(base, by_window)
    cmp["notes"] = notes
    out = Path(out_dir)
    atomic_write_files({out / "window.json": dumps_json(cmp), out / "window.md": render_window(cmp, notes)})  # both or neither
    return cmp
