"""``fidelity aggregate`` and ``fidelity paired`` over the published ladder receipts: the tables they print and
the files they write (``receipts.json``, ``receipts.md``, the harness's ``ladder.md``/``ladder.json`` and,
given sizes, ``kld-vs-size.png``), written together or not at all.

The headline table puts the receipt's figures re-derived by the published method (``--method published``:
only these) beside this project's studentized interval of the token mean; the paired table the published
differences, intervals and wins beside this project's interval of the token-mean difference and its verdict.
Walk-through: docs/qwen38-receipts.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.errors import VerificationError
from harness.interchange.ladder_receipts import CumulativeReceipt, read_cumulative, read_paired
from harness.interchange.manifest_read import SuiteManifest, read_manifest
from harness.interchange.receipt_figures import candidate_figures, check_inputs, paired_figures
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.figure import png_bytes
from harness.io.md_table import md_table
from harness.reports.aggregate import LadderLine, ladder_files
from harness.reports.plot import SizePoint, kld_vs_size_figure
from harness.reports.units import GIB

SCHEMA = "fidelity.published-receipts/1"
METHODS = ("exact", "published")


def manifest_path(suite: Path) -> Path:
    """The manifest a ``--suite`` names: the file itself, or ``suite-manifest.json`` in the folder."""
    return suite / "suite-manifest.json" if suite.is_dir() else suite


def _num(x: float, method: str, sign: str = "") -> str:
    """A figure as printed: every digit (``repr``) for ``published`` (to be compared with the receipt's JSON), else 6 decimals."""
    return repr(x) if method == "published" else f"{x:{sign}.6f}"


def _ci(ci: Sequence[float] | None, method: str = "exact", sign: str = "") -> str:
    return "not estimable" if ci is None else f"[{_num(ci[0], method, sign)}, {_num(ci[1], method, sign)}]"


def headline_lines(figs: Sequence[Mapping[str, Any]], method: str) -> list[str]:
    """The headline rows as a Markdown table: the published method's figures, and (``exact``) this project's interval."""
    head = ["candidate", "contexts", "positions", "clusters", "token mean KLD", "top-1",
            "published 95% (percentile, context means)"]
    if method == "exact":
        head.append("this harness 95% (studentized, token mean)")
    rows = []
    for f in figs:
        top1 = repr(f["top1_agreement"]) if method == "published" else f"{f['top1_agreement']:.4f}"
        row = [f["candidate"], f["contexts"], f["scored_positions"], f["source_clusters"],
               _num(f["token_mean_kld"], method), top1, _ci(f["published_ci95"], method)]
        rows.append(row + ([_ci(f["own_ci95"])] if method == "exact" else []))
    return md_table(head, rows)


def paired_lines(rows: Sequence[Mapping[str, Any]], method: str) -> list[str]:
    """The paired rows as a Markdown table (published columns; with ``exact`` this project's interval and verdict)."""
    head = ["a - b", "contexts", "difference", "published 95% (percentile)", "a wins", "b wins", "clusters"]
    if method == "exact":
        head += ["this harness 95% (studentized, token means)", "verdict (margin)"]
    out = []
    for r in rows:
        row = [f"{r['a']} - {r['b']}", r["contexts"], _num(r["difference_a_minus_b"], method, "+"),
               _ci(r["published_ci95"], method, "+"), r["a_wins"], r["b_wins"], r["clusters"]]
        if method == "exact":
            v = "no margin given" if r["verdict"] is None else f"{r['verdict']} (±{r['margin']:g})"
            row += [_ci(r["own_ci95"], method, "+"), v]
        out.append(row)
    return md_table(head, out)


class ReceiptRow(LadderLine):
    """A ladder row of a published receipt: the table's fields, the receipt's own interval and the receipt file."""

    max_kld: float | None
    published_ci95: list[float] | None
    receipt: str
    receipt_sha256: str


def _ladder_row(f: Mapping[str, Any], rc: CumulativeReceipt, size: int | None) -> ReceiptRow:
    """A row for the harness's ladder writer: the interval is this project's; the p99 column the receipt's summed-tail
    bracket when it has one, else its exact maximum (an upper bound of any quantile)."""
    tail = rc.doc.get("tail")
    p99 = tail["quantiles"]["p99"] if isinstance(tail, dict) else None
    top = f["max_kld"] if f["max_kld"] is not None else float("inf")
    shards = rc.doc.get("suite", {}).get("shards") or []
    return {"candidate": f["candidate"], "size_bytes": size, "shards": shards, "n_positions": f["scored_positions"],
            "mean_kld": f["token_mean_kld"], "ci95": f["own_ci95"], "published_ci95": f["published_ci95"],
            "p99_bounds": [p99["lower"], p99["upper"]] if p99 else [0.0, top], "max_kld": f["max_kld"],
            "top1": f["top1_agreement"], "verdict": "—", "receipt": f["receipt"], "receipt_sha256": f["receipt_sha256"]}


def _plot(rows: Sequence[ReceiptRow]) -> bytes:
    pts: list[SizePoint] = [{"candidate": r["candidate"], "size_gib": r["size_bytes"] / GIB, "mean_kld": r["mean_kld"], "ci95": r["ci95"]}
           for r in rows if r["size_bytes"]]
    fig, _axes, _labels = kld_vs_size_figure(pts)
    return png_bytes(fig, dpi=120)


#: What the receipts of one ladder must share: the head, filter and vocabulary every candidate was scored through,
#: and the reference's identity (its config and index digests); with the window (``score_from``) checked beside them.
SHARED = ("head_sha256", "candidate_head_sha256", "filter", "vocab_size", "reference_identity.config_sha256",
          "reference_identity.index_sha256")


def _field(doc: Mapping[str, Any], dotted: str) -> Any:
    head, _, rest = dotted.partition(".")
    value = doc.get(head)
    return _field(value, rest) if rest and isinstance(value, Mapping) else (None if rest else value)


def same_measurement(receipts: Sequence[CumulativeReceipt]) -> None:
    """Every receipt of a ladder scored through the same head, filter, reference and window as the first."""
    first = receipts[0]
    for rc in receipts[1:]:
        for key in SHARED:
            if _field(rc.doc, key) != _field(first.doc, key):
                raise VerificationError(rc.path, f"{key} (that of {first.path})", _field(first.doc, key), _field(rc.doc, key),
                                        "receipts of two measurements are never one ladder")
        if rc.score_from != first.score_from:
            raise VerificationError(rc.path, f"scored_position_window.score_from (that of {first.path})", first.score_from,
                                    rc.score_from, "two windows are two measurements")


def aggregate_receipts(paths: Sequence[Path], suite: Path, out: Path, *, method: str = "exact", selection: str = "all",
                       sizes: Mapping[str, int] | None = None) -> list[str]:
    """Read and check every receipt against the suite manifest, re-derive each candidate's figures, write the files;
    returns the lines to print."""
    m = read_manifest(manifest_path(suite))
    chosen = None if selection == "all" else m.selected(selection)
    receipts = [read_cumulative(p, m) for p in paths]
    names = [rc.candidate for rc in receipts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise VerificationError(paths[names.index(twice[0])], "candidate", "one receipt per candidate", f"{twice[0]} twice")
    same_measurement(receipts)
    figs = sorted((candidate_figures(rc, chosen) for rc in receipts), key=lambda f: (f["token_mean_kld"], f["candidate"]))
    by = {rc.candidate: rc for rc in receipts}
    rows = [_ladder_row(f, by[f["candidate"]], (sizes or {}).get(f["candidate"])) for f in figs]
    lines = headline_lines(figs, method)
    note = (f"{m.path.name} ({m.schema}, {len(m.rows)} contexts, suite_token_sha256 {m.suite_token_sha256[:12]}…); "
            f"selection {selection}" + ("" if chosen is None else f" ({len(chosen)} contexts: re-derived, not compared with the "
                                                                    "receipts' printed figures, which cover every context)"))
    md = "# Published ladder receipts, re-derived\n\n" + note + "\n\n" + "\n".join(lines) + "\n"
    files: dict[Path, str | bytes] = {out / "receipts.json": dumps_json({"schema": SCHEMA, "method": method, "selection": selection,
                                                                         "suite": {"manifest": str(m.path), "sha256": m.sha256,
                                                                                   "schema": m.schema,
                                                                                   "suite_token_sha256": m.suite_token_sha256},
                                                                         "candidates": figs}),
                                      out / "receipts.md": md}
    files.update(ladder_files(out, rows))
    if any(r["size_bytes"] for r in rows):
        files[out / "kld-vs-size.png"] = _plot(rows)
    atomic_write_files(files)
    return [note, *lines, *(f"{p}: written" for p in sorted(files))]


def _resamples(path: Path, doc: Mapping[str, Any]) -> tuple[int, int]:
    """The resamples and seed of a paired receipt's interval, as its ``method.interval`` states them."""
    text = str((doc.get("method") or {}).get("interval"))
    found = re.search(r"([\d,]+) resamples, seed (\d+)", text)
    if found is None:
        raise VerificationError(path, "method.interval", "'<N> resamples, seed <S>'", repr(text))
    return int(found.group(1).replace(",", "")), int(found.group(2))


def paired_receipt(path: Path, out: Path, *, suite: Path | None = None, inputs: Path | None = None, margin: float | None = None,
                   method: str = "exact") -> list[str]:
    """Re-derive every comparison of the paired receipt at ``path`` from its inputs (found by their file names in
    ``inputs``, default the receipt's folder), checked against ``suite`` when given; write ``<out>/paired-receipt.json``/``.md``."""
    doc = read_paired(path)
    m: SuiteManifest | None = None if suite is None else read_manifest(manifest_path(suite))
    if m is not None and (doc.get("suite") or {}).get("suite_token_sha256") not in (None, m.suite_token_sha256):
        raise VerificationError(path, f"suite.suite_token_sha256 (that of {m.path})", m.suite_token_sha256, doc["suite"]["suite_token_sha256"])
    folder = inputs if inputs is not None else path.parent
    receipts = {label: read_cumulative(folder / Path(str(ref.get("path", ""))).name, m) for label, ref in doc["inputs"].items()}
    check_inputs(path, doc, receipts)
    samples, seed = _resamples(path, doc)
    for c in doc["comparisons"].values():
        same_measurement([receipts[c["a"]], receipts[c["b"]]])
    rows = [paired_figures(path, key, c, receipts[c["a"]], receipts[c["b"]], margin, samples=samples, seed=seed)
            for key, c in doc["comparisons"].items()]
    lines = paired_lines(rows, method)
    md = f"# {path.name}, re-derived\n\n" + "\n".join(lines) + "\n"
    atomic_write_files({out / "paired-receipt.json": dumps_json({"schema": SCHEMA, "method": method, "paired": str(path),
                                                                 "comparisons": rows}),
                        out / "paired-receipt.md": md})
    return [*lines, f"{out / 'paired-receipt.json'}: written", f"{out / 'paired-receipt.md'}: written"]
