"""The report cases beside the candidate x shard cases: tails, windows, paired, adaptive records, cross-engine floors.

Each case computes a JSON-ready payload from the session's scored positions (cached per process:
nothing is recaptured, positions already scored are not rescored), checks it (``check()`` raises
``AssertionError`` with a readable message) and hands the payload home; the controller gathers the
payloads of a run and writes the combined artifacts with :func:`write_extras`:

======== =================================== =========================================
kind     one case per                        artifacts (in the report dir)
======== =================================== =========================================
tails    candidate (``tails-<name>``)        ``tails.json``, ``tails.md``, ``tails.png``
window   window ``k`` (``window-from<k>``)   ``window.json``, ``window.md``
paired   declared pair (``pair-<a>-vs-<b>``) ``paired/<a>-vs-<b>.json`` and ``.md``
adaptive each scored shard under adaptive    ``adaptive.json``, ``adaptive.md``
======== =================================== =========================================

Kind ``cross_engine`` (sent by ``fidelity_tests/test_cross_engine.py``): the floor matrix and the
candidates net of their engine's floor, written as ``cross_engine.json`` and ``cross_engine.md``
and printed in full (:mod:`harness.run.cross_engine`).

No pytest import here: the plugin builds these objects in its fixtures.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _positions(session: Any, name: str, shards: Sequence[int]) -> list[Any]:
    cand = session.config.candidate(name)
    return [session.positions(cand, s) for s in shards]


@dataclass
class TailCase:
    """One candidate's tail report over the selected shards."""

    payload: dict[str, Any]
    max_p99: float | None

    @classmethod
    def run(cls, session: Any, name: str, shards: Sequence[int]) -> TailCase:
        from harness.reports.tails import baseline_max_p99, check_tails, tail_report

        rep = tail_report(name, list(zip(shards, _positions(session, name, shards))), session.score_from)
        limit = baseline_max_p99(session.config.baselines, name, shards)
        rep["max_p99_baseline"] = limit
        rep["problems"] = check_tails(rep, limit)
        return cls(rep, limit)

    def check(self) -> None:
        __tracebackhide__ = True
        if self.payload["problems"]:
            raise AssertionError("\n".join(self.payload["problems"]))


@dataclass
class WindowCase:
    """All candidates summarized from row ``k`` and at the base window, compared."""

    payload: dict[str, Any]
    expected_positions: int

    @classmethod
    def run(cls, session: Any, k: int, shards: Sequence[int], notes: Sequence[str] = ()) -> WindowCase:
        from harness.reports.windows import expected_positions, window_summary

        base = session.score_from
        n_boot = session.config.n_boot
        from harness.errors import FidelityError

        summaries, base_summaries = {}, {}
        notes = list(notes)
        for cand in session.config.candidates:
            try:
                pos = _positions(session, cand.name, shards)
            except FidelityError as e:  # a candidate that cannot be scored fails its own cases, not this one
                notes.append(f"{cand.name} left out of the window comparison: it could not be scored ({e})")
                continue
            summaries[cand.name] = window_summary(pos, k, n_boot=n_boot)
            base_summaries[cand.name] = summaries[cand.name] if k == base else window_summary(pos, base, n_boot=n_boot)
        n_ctx = sum(len(session.shard_indices(s)) for s in shards)
        payload = {"base": base, "k": k, "summaries": summaries, "base_summaries": base_summaries, "notes": list(notes)}
        return cls(payload, expected_positions(n_ctx, session.suite.n_ctx, k))

    def comparison(self) -> dict[str, Any]:
        from harness.reports.windows import compare_windows

        p = self.payload
        by_window = {p["base"]: p["base_summaries"], p["k"]: p["summaries"]}
        return compare_windows(p["base"], by_window)

    def check(self) -> None:
        """n_positions follows the window arithmetic; a flip real at both windows (paired difference interval) fails, others warn."""
        __tracebackhide__ = True
        from harness.reports.windows import flip_message

        p = self.payload
        bad = {c: s["n_positions"] for c, s in p["summaries"].items() if s["n_positions"] != self.expected_positions}
        if bad:
            raise AssertionError(f"score_from={p['k']}: n_positions {bad}, expected {self.expected_positions} "
                                 "(contexts x (n_ctx - 1 - k))")
        w = self.comparison()["windows"][str(p["k"])]
        if w["flips"]["warnings"]:
            warnings.warn(f"score_from={p['k']}: ranking flips within overlapping intervals (noise): "
                          + ", ".join(f"{a}/{b}" for a, b in w["flips"]["warnings"]), UserWarning, stacklevel=2)
        if w["flips"]["failures"]:
            raise AssertionError(flip_message(p["k"], p["base"], w["flips"]["failures"]))


@dataclass
class PairCase:
    """A declared pair compared on the same positions (common random numbers)."""

    payload: dict[str, Any]
    expect: str | None = None

    @classmethod
    def run(cls, session: Any, a: str, b: str, margin: float, shards: Sequence[int], expect: str | None = None) -> PairCase:
        from harness.reports.paired import paired_report

        rep = paired_report(a, b, _positions(session, a, shards), _positions(session, b, shards), margin=margin,
                            score_from=session.score_from, n_boot=session.config.n_boot)
        return cls(rep, expect)

    def check(self) -> None:
        """Internally consistent; equals the declared ``expect`` verdict when the pair declares one."""
        __tracebackhide__ = True
        from harness.reports.paired import check_paired

        problems = check_paired(self.payload, self.expect)
        if problems:
            raise AssertionError("\n".join(problems))


def write_extras(report_dir: str | Path, extras: Mapping[str, Sequence[dict[str, Any]]],
                 palette_names: Sequence[str] | None = None, written: list[Path] | None = None) -> list[str]:
    """Controller side: write the artifacts of every kind present; returns summary lines. ``palette_names``:
    the configuration's candidates, which fix each candidate's colour in the figures; ``written`` (when given)
    receives the paths of the files written."""
    out = Path(report_dir)
    lines = []
    files: list[Path] = [] if written is None else written
    if extras.get("tails"):
        from harness.reports.tails import write_tails

        files += write_tails(out, extras["tails"], palette_names)
        lines.append(f"tails: {out / 'tails.md'}, {out / 'tails.png'}")
    if extras.get("window"):
        from harness.reports.windows import write_window

        cmp = write_window(out, extras["window"])
        files += [out / "window.json", out / "window.md"]
        lines.append(f"window: {cmp['verdict']} ({out / 'window.md'})")
    for rep in extras.get("paired", []):
        from harness.reports.paired import write_paired

        path, md_path = write_paired(out, rep)
        files += [path, md_path]
        ci = rep["kld_mean"]["ci95"]
        iv = "not estimable" if ci is None else f"95% [{ci[0]:.4g}, {ci[1]:.4g}]"
        cm = rep.get("certifiable_margin")
        lines.append(f"paired {rep['a']} vs {rep['b']}: {rep['verdict_named']} (diff {rep['kld_mean']['diff']:.4g}, {iv}, "
                     f"margin ±{rep['margin']:g}, certifiable ±{cm:.2g}) {path}" if cm is not None else
                     f"paired {rep['a']} vs {rep['b']}: {rep['verdict_named']} (diff {rep['kld_mean']['diff']:.4g}, {iv}, "
                     f"margin ±{rep['margin']:g}) {path}")
    for doc in extras.get("cross_engine", []):
        from harness.run.cross_engine import from_json_dict, matrix_lines, net_lines, write_cross_engine

        matrix, rows = from_json_dict(doc)
        md, js = write_cross_engine(out, matrix, rows)
        files += [md, js]
        lines += matrix_lines(matrix) + [""] + net_lines(matrix, rows) + ["", f"cross-engine: {md}, {js}"]
    if extras.get("adaptive"):
        from harness.gate.adaptive import write_adaptive

        write_adaptive(out, extras["adaptive"])
        files += [out / "adaptive.json", out / "adaptive.md"]
        stops = [r for r in extras["adaptive"] if r["side"] and r["look"] < r["looks"]]
        for r in stops:
            lines.append(f"adaptive: {r['candidate']} stopped after shard {r['shard']:02d} (look {r['look']}/{r['looks']}, "
                         f"{'below' if r['side'] == 'below' else 'above'} max_mean_kld)")
        lines.append(f"adaptive: {out / 'adaptive.md'}")
    return lines
