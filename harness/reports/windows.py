"""Scoring-window controls (``pytest fidelity.toml -m fidelity_window``): the same captures rescored from row ``k``.

A window ``score_from=k`` drops rows ``< k`` of every context before any statistic (docs/design.md
section 2); llama.cpp's ``llama-perplexity`` scores the second half of each chunk
(``k = n_ctx/2``). The controls rescore the *same* scored positions (no recapture, no GEMMs)
at ``k`` in :data:`WINDOWS` (0, 64 and n_ctx/2) and report, per candidate, the mean KLD, its
95% studentized source-cluster interval, ``n_positions`` and the relative change against the
run's base window (``--fidelity-window``, default 0). Windows that leave no position
(``k > n_ctx - 2``) are skipped with a note.

Reasoning: docs/statistics.md §"The scoring-window rule and its power".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np

from harness.errors import VerificationError
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.kept import kept
from harness.io.md_table import md_table
from harness.metrics import bootstrap
from harness.metrics.bootstrap import DEFAULT_SEED, draw_cluster_weights, ratio_interval, ratio_replicates
from harness.metrics.positions import ScoredPositions, layout
from harness.metrics.records import ContextRow
from harness.metrics.scores import PositionScores
from harness.reports.numbers import fmt_g

SCHEMA = "fidelity.window/1"
WINDOWS = (0, 64, "half")


class ClusterSums(TypedDict):
    """Per source cluster: its name, KLD sum and positions at the window, with the bootstrap's draws (``n_boot``,
    ``seed``): enough to re-derive the interval and to pair two candidates of the same positions."""

    names: list[str]
    sum_kld: list[float]
    positions: list[float]
    n_boot: int
    seed: int


class WindowSummary(TypedDict):
    """One candidate at one window (:func:`window_summary`)."""

    score_from: int
    n_positions: int
    n_contexts: int
    mean_kld: float
    #: the 95% source-cluster interval (None: not estimable)
    ci95: list[float] | None
    clusters: ClusterSums


class WindowCandidate(WindowSummary):
    """A candidate in ``window.json``: its summary and the change of its mean KLD against the base window
    (None: a base mean of 0)."""

    rel_change_mean_kld: float | None


class Flips(TypedDict):
    """Pairs ``[a, b]`` ranked a < b at the base window and b < a at this one: real at both windows, or noise."""

    failures: list[list[str]]
    warnings: list[list[str]]


class WindowResult(TypedDict):
    """One window of ``window.json``: the ranking, every candidate, the flips against the base window."""

    ranking: list[str]
    candidates: dict[str, WindowCandidate]
    flips: Flips


class WindowPower(TypedDict):
    """The smallest reversal detected with power ``level``: per window, per adjacent pair ``"a|b"`` (None: not
    detectable)."""

    level: float
    smallest_reversal: dict[str, dict[str, float | None]]


class WindowComparison(TypedDict):
    """``window.json`` (``fidelity.window/1``; :func:`compare_windows`)."""

    schema: str
    base_window: int
    ranking_base: list[str]
    windows: dict[str, WindowResult]
    verdict: str
    power: WindowPower
    #: the windows skipped (set by :func:`write_window`)
    notes: NotRequired[list[str]]
    #: the shards summarized (set by :func:`write_window`): a reader re-derives the base window from their reports
    shards: NotRequired[list[int]]


class WindowPayload(TypedDict):
    """What one window case sends home (the payload of the ``window`` report kind): every candidate summarized
    from row ``k`` and at the base window, the notes of windows skipped and candidates left out, the shards."""

    base: int
    k: int
    summaries: dict[str, WindowSummary]
    base_summaries: dict[str, WindowSummary]
    notes: list[str]
    shards: list[int]


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


def window_summary(positions: Sequence[ScoredPositions], k: int, *, n_boot: int, seed: int | None = None) -> WindowSummary:
    """Mean KLD, 95% source-cluster interval and counts of one candidate's positions at window ``k``.

    ``positions``: :class:`harness.run.shard.ShardPositions` of the selected shards."""
    scores = PositionScores.concat([p.scores for p in positions])
    ctx = np.concatenate([p.context_index for p in positions])
    row = np.concatenate([p.row for p in positions])
    labels = [lab for p in positions for lab in p.labels]
    L = layout(scores, ctx, row, labels, k)
    C = L.n_clusters
    seed = DEFAULT_SEED if seed is None else seed
    W = draw_cluster_weights(C, n_boot, seed)
    sums = np.bincount(L.cluster, weights=L.scores.kld, minlength=C)
    counts = np.bincount(L.cluster, minlength=C).astype(np.float64)
    return {
        "score_from": int(k),
        "n_positions": len(L.scores),
        "n_contexts": len(L.contexts),
        "mean_kld": float(L.scores.kld.mean()),
        "ci95": ratio_interval(W, sums, counts, bounds=(0.0, float("inf"))),
        "clusters": {"names": [str(c) for c in L.cluster_names], "sum_kld": sums.tolist(), "positions": counts.tolist(),
                     "n_boot": int(n_boot), "seed": int(seed)},
    }


def paired_difference(sa: WindowSummary, sb: WindowSummary) -> list[float] | None:
    """95% interval of mean KLD ``a - b`` from two :func:`window_summary` of the same positions
    (shared cluster draws; None when not estimable)."""
    ca, cb = sa["clusters"], sb["clusters"]
    if ca["names"] != cb["names"] or ca["positions"] != cb["positions"]:
        raise ValueError("window summaries: the two candidates were not summarized on the same positions")
    counts = np.asarray(ca["positions"], dtype=np.float64)
    W = draw_cluster_weights(len(counts), int(ca["n_boot"]), int(ca["seed"]))
    return ratio_interval(W, np.asarray(ca["sum_kld"]) - np.asarray(cb["sum_kld"]), counts)


#: Power at which window.md states the smallest detectable reversal.
POWER = 0.8
#: Largest reversal searched (as a fraction of the pair's mean KLD); beyond it: "not detectable".
MAX_REVERSAL = 10.0


def _paired_draws(sa: WindowSummary, sb: WindowSummary) -> tuple[float, np.ndarray, list[float] | None]:
    """Observed mean-KLD difference ``a - b``, its centered bootstrap replicates and its 95% interval."""
    ca, cb = sa["clusters"], sb["clusters"]
    counts = np.asarray(ca["positions"], dtype=np.float64)
    diff = np.asarray(ca["sum_kld"], dtype=np.float64) - np.asarray(cb["sum_kld"], dtype=np.float64)
    W = draw_cluster_weights(len(counts), int(ca["n_boot"]), int(ca["seed"]))
    est = float(diff.sum() / counts.sum())
    return est, ratio_replicates(W, diff, counts) - est, ratio_interval(W, diff, counts)


def detectable_reversal(base_a: WindowSummary, base_b: WindowSummary, k_a: WindowSummary,
                        k_b: WindowSummary, power: float = POWER) -> float | None:
    """The smallest ``rho`` (a fraction of the pair's mean KLD) such that a true difference ``a - b`` of
    ``+rho * m_base`` at the base window and ``-rho * m_k`` at window ``k`` (or the mirror image) is flagged
    as a failure with probability >= ``power`` (docs/statistics.md §"The scoring-window rule and its power"). None: not estimable, or beyond
    :data:`MAX_REVERSAL`. The four arguments are :func:`window_summary` dicts of the same clusters and draws."""
    for sa, sb in ((base_a, base_b), (k_a, k_b)):
        if sa["clusters"]["names"] != sb["clusters"]["names"]:
            raise ValueError("window summaries: the two candidates were not summarized on the same positions")
    if base_a["clusters"]["names"] != k_a["clusters"]["names"] or base_a["clusters"]["n_boot"] != k_a["clusters"]["n_boot"]:
        raise ValueError("window summaries: the two windows were not summarized on the same clusters and draws")
    est0, e0, iv0 = _paired_draws(base_a, base_b)
    estk, ek, ivk = _paired_draws(k_a, k_b)
    if iv0 is None or ivk is None:
        return None
    m0 = 0.5 * (float(base_a["mean_kld"]) + float(base_b["mean_kld"]))
    mk = 0.5 * (float(k_a["mean_kld"]) + float(k_b["mean_kld"]))
    if m0 <= 0 or mk <= 0:
        return None
    lo0, hi0 = est0 - iv0[0], iv0[1] - est0  # half-widths of the observed intervals
    lok, hik = estk - ivk[0], ivk[1] - estk

    def detected(rho: float) -> float:
        up_down = float(np.mean((rho * m0 + e0 > lo0) & (-rho * mk + ek < -hik)))
        down_up = float(np.mean((-rho * m0 + e0 < -hi0) & (rho * mk + ek > lok)))
        return min(up_down, down_up)

    if detected(MAX_REVERSAL) < power:
        return None
    lo, hi = 0.0, MAX_REVERSAL
    while hi - lo > 1e-4 * max(hi, 1e-3):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if detected(mid) >= power else (mid, hi)
    return hi


def reversal_power(base: int, by_window: Mapping[int, Mapping[str, WindowSummary]], rank0: Sequence[str]) -> dict[str, dict[str, float | None]]:
    """Per window ``k`` (not the base), per pair adjacent in the base ranking (``"a|b"``): :func:`detectable_reversal`."""
    ref = by_window[base]
    out: dict[str, dict[str, float | None]] = {}
    for k in sorted(by_window):
        if k == base:
            continue
        cur = by_window[k]
        pairs = [(a, b) for a, b in zip(rank0, rank0[1:]) if a in cur and b in cur]
        out[str(k)] = {f"{a}|{b}": detectable_reversal(ref[a], ref[b], cur[a], cur[b]) for a, b in pairs}
    return out


def _real_order(sa: WindowSummary, sb: WindowSummary) -> int:
    """-1 when a's mean KLD is lower than b's beyond noise, +1 when higher, 0 when indistinguishable."""
    ci = paired_difference(sa, sb)
    if ci is None:
        return 0
    return -1 if ci[1] < 0 else (1 if ci[0] > 0 else 0)


def compare_windows(base: int, by_window: Mapping[int, Mapping[str, WindowSummary]]) -> WindowComparison:
    """Relative changes and ranking flips against the base window.

    ``by_window[k][candidate]`` is a :func:`window_summary`. Returns the JSON-ready comparison with a
    ``verdict`` line, per window ``flips`` (``failures`` and ``warnings``); kept by its inputs' content
    (:func:`harness.io.kept.kept`: each case's check and the report writer compute it once)."""
    return kept("window-comparison", {"base": base, "by_window": by_window}, [__file__, bootstrap.__file__],
                lambda: _compare_windows(base, by_window))


def _compare_windows(base: int, by_window: Mapping[int, Mapping[str, WindowSummary]]) -> WindowComparison:
    ref = by_window[base]
    rank0 = sorted(ref, key=lambda c: (ref[c]["mean_kld"], c))
    windows: dict[str, WindowResult] = {}
    n_fail = n_warn = 0
    for k in sorted(by_window):
        cur = by_window[k]
        rank = sorted(cur, key=lambda c: (cur[c]["mean_kld"], c))
        failures: list[list[str]] = []
        warnings: list[list[str]] = []
        for i, a in enumerate(rank0):
            for b in rank0[i + 1 :]:
                if a in cur and b in cur and rank.index(a) > rank.index(b):
                    real = _real_order(ref[a], ref[b]) * _real_order(cur[a], cur[b]) == -1
                    (failures if real else warnings).append([a, b])
        n_fail += len(failures)
        n_warn += len(warnings)
        windows[str(k)] = {
            "ranking": rank,
            "candidates": {
                c: {**cur[c], "rel_change_mean_kld": (cur[c]["mean_kld"] / ref[c]["mean_kld"] - 1.0) if ref[c]["mean_kld"] else None}
                for c in sorted(cur)
            },
            "flips": {"failures": failures, "warnings": warnings},
        }
    if n_fail:
        verdict = f"ranking CHANGES with the window ({n_fail} flip(s) real at both windows: paired interval excludes 0)"
    elif n_warn:
        verdict = f"ranking stable within noise ({n_warn} flip(s) whose paired difference interval contains 0 at a window)"
    else:
        verdict = "ranking stable across windows"
    return {"schema": SCHEMA, "base_window": base, "ranking_base": rank0, "windows": windows, "verdict": verdict,
            "power": {"level": POWER, "smallest_reversal": reversal_power(base, by_window, rank0)}}


def _near(x: object, y: object, rel: float = 1e-9) -> bool:
    """Two JSON values equal, numbers to ``rel`` (summation order)."""
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_near(x[k], y[k], rel) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_near(a, b, rel) for a, b in zip(x, y))
    if isinstance(x, float) or isinstance(y, float):
        return isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isclose(x, y, rel_tol=rel, abs_tol=1e-300)
    return bool(x == y)


def verify_window(doc: WindowComparison, path: str | Path, rows: Mapping[str, Mapping[int, Sequence[ContextRow]]],
                  n_boot: int | None = None) -> None:
    """Refuse a ``window.json`` (read back from ``path``) that does not follow from itself and the shard reports.

    * every summary from its own per-cluster sums: ``n_positions``, ``mean_kld`` and ``ci95`` (this harness's seed,
      the configuration's ``n_boot`` when given); the rankings, relative changes, flips, verdict and power are
      :func:`compare_windows` of those summaries;
    * with the summarized ``shards`` recorded: the base window of every candidate is its shard reports' (each
      cluster's KLD sum and positions); at a later window ``k`` each cluster holds ``k - base`` positions fewer
      per context, and no more KLD than at the base window. The sums of a later window need the positions
      themselves and are bounded, not re-derived."""
    base = doc["base_window"]
    by_window: dict[int, dict[str, WindowSummary]] = {}
    for key, w in doc["windows"].items():
        k = int(key)
        by_window[k] = {}
        for c, s in w["candidates"].items():
            cl, at = s["clusters"], f"windows.{key}.candidates.{c}"
            if cl["seed"] != DEFAULT_SEED or (n_boot is not None and cl["n_boot"] != n_boot):
                raise VerificationError(path, f"{at}.clusters", f"seed {DEFAULT_SEED}" + (f", n_boot {n_boot}" if n_boot else ""),
                                        f"seed {cl['seed']}, n_boot {cl['n_boot']}")
            sums, counts = np.asarray(cl["sum_kld"], dtype=np.float64), np.asarray(cl["positions"], dtype=np.float64)
            if len(sums) != len(cl["names"]) or len(counts) != len(cl["names"]) or not counts.sum() > 0:
                raise VerificationError(path, f"{at}.clusters", "one sum and one count per named cluster", f"{len(sums)}, {len(counts)}")
            ci = ratio_interval(draw_cluster_weights(len(counts), int(cl["n_boot"]), int(cl["seed"])), sums, counts,
                                bounds=(0.0, float("inf")))
            mean = float(sums.sum() / counts.sum())
            fields: tuple[tuple[str, object, object, float], ...] = (
                ("n_positions", int(counts.sum()), s["n_positions"], 0.0), ("mean_kld", mean, s["mean_kld"], 1e-9),
                ("ci95", ci, s["ci95"], 1e-6))
            for field_, want, got, rel in fields:
                if not (want == got if rel == 0.0 else _near(want, got, rel)):
                    raise VerificationError(path, f"{at}.{field_}", f"{want!r} (from its clusters)", got)
            by_window[k][c] = {"score_from": s["score_from"], "n_positions": s["n_positions"], "n_contexts": s["n_contexts"],
                               "mean_kld": s["mean_kld"], "ci95": s["ci95"], "clusters": s["clusters"]}
    if base not in by_window:
        raise VerificationError(path, "base_window", f"one of the windows ({sorted(by_window)})", base)
    want_doc = compare_windows(base, by_window)
    tops: tuple[tuple[str, object, object], ...] = (("ranking_base", want_doc["ranking_base"], doc["ranking_base"]),
                                                    ("verdict", want_doc["verdict"], doc["verdict"]),
                                                    ("power", want_doc["power"], doc["power"]))
    for key, want_v, got_v in tops:
        if not _near(want_v, got_v, 1e-6):
            raise VerificationError(path, key, f"{want_v!r} (from the summaries)", got_v)
    for wk, w in want_doc["windows"].items():
        mine = doc["windows"][wk]
        for key, want_w, got_w in (("ranking", w["ranking"], mine["ranking"]), ("flips", w["flips"], mine["flips"])):
            if want_w != got_w:
                raise VerificationError(path, f"windows.{wk}.{key}", f"{want_w!r} (from the summaries)", got_w)
        for c, cand in w["candidates"].items():
            if not _near(cand["rel_change_mean_kld"], mine["candidates"][c]["rel_change_mean_kld"]):
                raise VerificationError(path, f"windows.{wk}.candidates.{c}.rel_change_mean_kld", cand["rel_change_mean_kld"],
                                        mine["candidates"][c]["rel_change_mean_kld"])
    shards = doc.get("shards")
    if shards is None:
        return
    for c, summary in by_window[base].items():
        if c not in rows or any(x not in rows[c] for x in shards):
            raise VerificationError(path, f"windows.{base}.candidates.{c}", f"shard reports of shards {shards}", "missing")
        names: dict[str, int] = {}
        ctx = [r for x in shards for r in rows[c][x]]
        idx = np.array([names.setdefault(str(r["cluster"]), len(names)) for r in ctx], dtype=np.int64)
        want_sums = np.bincount(idx, weights=[float(r["sum_kld"]) for r in ctx], minlength=len(names))
        want_pos = np.bincount(idx, weights=[float(r["positions"]) for r in ctx], minlength=len(names))
        per_ctx = np.bincount(idx, minlength=len(names)).astype(np.float64)
        got = summary["clusters"]
        if list(names) != got["names"] or want_pos.tolist() != got["positions"] or not _near(want_sums.tolist(), got["sum_kld"]):
            raise VerificationError(path, f"windows.{base}.candidates.{c}.clusters", f"the shard reports' (shards {shards})",
                                    "other clusters, positions or KLD sums")
        for k in sorted(by_window):
            if k <= base or c not in by_window[k]:
                continue
            kc = by_window[k][c]["clusters"]
            pos_k = np.maximum(want_pos - per_ctx * (k - base), 0.0)  # each context loses k - base rows
            if kc["names"] != got["names"] or pos_k.tolist() != kc["positions"] or \
                    bool((np.asarray(kc["sum_kld"]) > want_sums * (1 + 1e-9) + 1e-300).any()):
                raise VerificationError(path, f"windows.{k}.candidates.{c}.clusters", f"the base window's clusters less {k - base} "
                                        "positions a context, and no more KLD", "other positions or more KLD")


def flip_message(k: int, base: int, flips: Sequence[Sequence[str]]) -> str:
    """The failure text naming the candidates whose order flipped."""
    pairs = ", ".join(f"{a} < {b} at score_from={base} but {b} < {a} at score_from={k}" for a, b in flips)
    return f"ranking flips with the paired 95% difference interval excluding 0 at both windows: {pairs}"


def render_window(cmp: WindowComparison, notes: Sequence[str] = ()) -> str:
    """``window.md``: per window, each candidate's mean KLD, interval, positions and relative change."""
    lines = ["# Scoring-window control", "", f"**Verdict: {cmp['verdict']}.**", "",
             f"Base window score_from={cmp['base_window']}; the same scored positions are summarized again "
             "from row k (no recapture). A flip fails when the paired (shared-draws) 95% interval of the two "
             "candidates' mean-KLD difference excludes 0 at both windows; other flips are warnings.", ""]
    rows: list[list[object]] = []
    for k, w in sorted(cmp["windows"].items(), key=lambda t: int(t[0])):
        for c in w["ranking"]:
            d = w["candidates"][c]
            rel = "—" if d["rel_change_mean_kld"] is None else f"{100 * d['rel_change_mean_kld']:+.1f}%"
            ci = "not estimable" if d["ci95"] is None else f"[{fmt_g(d['ci95'][0])}, {fmt_g(d['ci95'][1])}]"
            rows.append([k, c, d["n_positions"], fmt_g(d["mean_kld"]), ci, rel])
    lines += md_table(["score_from", "candidate", "positions", "mean KLD", "95% interval", "change vs base"], rows)
    lines.append("")
    power = cmp.get("power")
    if power is not None and any(power["smallest_reversal"].values()):
        lines += [f"## What the flip rule can detect ({int(100 * power['level'])}% power)", "",
                  f"The smallest reversal flagged with {int(100 * power['level'])}% power at these clusters: a true "
                  "mean-KLD difference of +rho x the pair's mean KLD at the base window and -rho x it at score_from=k "
                  "(or the mirror image). From this report's own bootstrap draws (the same draws at both windows), "
                  "interval half-widths held at their observed values. Smaller reversals mostly show as warnings.", ""]
        reversals: list[list[object]] = []
        for k, pairs in sorted(power["smallest_reversal"].items(), key=lambda t: int(t[0])):
            for pair, rho in pairs.items():
                a, b = pair.split("|", 1)
                txt = "not detectable (beyond ±1000% or not estimable)" if rho is None else f"±{100 * rho:.1f}%"
                reversals.append([k, f"{a} vs {b}", txt])
        lines += md_table(["score_from", "pair (adjacent at the base window)", "smallest reversal detected"], reversals)
        lines.append("")
    for k, w in sorted(cmp["windows"].items(), key=lambda t: int(t[0])):
        for a, b in w["flips"]["failures"]:
            lines.append(f"- FLIP at score_from={k}: {a} and {b} (paired difference real at both windows)")
        for a, b in w["flips"]["warnings"]:
            lines.append(f"- flip within noise at score_from={k}: {a} and {b}")
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def merge_window_payloads(payloads: Sequence[WindowPayload]) -> tuple[int, dict[int, dict[str, WindowSummary]], list[str]]:
    """Combine the window cases' payloads (``base``, ``k``, ``summaries``, ``base_summaries``, ``notes``)."""
    by_window: dict[int, dict[str, WindowSummary]] = {}
    notes: list[str] = []
    base = int(payloads[0]["base"])
    for p in payloads:
        by_window.setdefault(int(p["k"]), {}).update(p["summaries"])
        by_window.setdefault(base, {}).update(p["base_summaries"])
        for n in p.get("notes", []):
            if n not in notes:
                notes.append(n)
    return base, by_window, notes


def write_window(out_dir: str | Path, payloads: Sequence[WindowPayload]) -> WindowComparison:
    """Write ``window.json`` and ``window.md``; returns the comparison."""
    from pathlib import Path

    base, by_window, notes = merge_window_payloads(payloads)
    cmp = compare_windows(base, by_window)
    cmp["notes"] = notes
    if payloads[0].get("shards") is not None:  # the shards summarized: a reader re-derives the base window from their reports
        cmp["shards"] = list(payloads[0]["shards"])
    out = Path(out_dir)
    atomic_write_files({out / "window.json": dumps_json(cmp), out / "window.md": render_window(cmp, notes)})  # both or neither
    return cmp
