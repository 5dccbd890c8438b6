"""The published report schemas ``qwen38-fidelity-report/1``, ``/2`` and ``/3``: written and read.

``/2`` carries a tail histogram (``kld_tail``) and complete per-context rows (``per_context_all``);
``/3`` is ``/2`` over a declared scored-position window (``scored_position_window.score_from > 0``);
``/1`` predates both. A report this project writes is a ``/2`` (or ``/3``) with one additive key,
``fidelity_method``: ``{"name": "exact" | "published", ...}``. A report without it was made by the
published tool, whose method is ``published`` (bf16-rounded logits); readers never combine reports
of two methods.

Reasoning: docs/interchange.md §"The report schemas".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import VerificationError
from harness.inputs.interchange_layout import REPORT_FULL, REPORT_LEGACY, REPORT_WINDOWED, TAIL_SCHEMA, WINDOW_SCHEMA
from harness.interchange.bootstrap_method import percentile_bootstrap
from harness.io import domain
from harness.io.jsonio import read_json

if TYPE_CHECKING:
    from harness.inputs.suite import Suite
    from harness.reports.shard import ShardReport

#: Binning of the published tail histogram (the same edges as this project's histogram).
LOG10_LOW, LOG10_HIGH, BINS_PER_DECADE = -12.0, 2.0, 40
ROW_FIELDS = ("index", "source_cluster", "stratum", "positions_scored", "mean_kld", "top1_agreement")
REQUIRED = ("schema", "contexts", "scored_positions", "token_mean_kld", "top1_agreement", "suite_token_sha256",
            "per_context_all", "context_macro_mean_kld")
TOLERANCE = 1e-6
#: Optional headline figures of a report that are divergences (KLD in nats, JSD in bits): never negative.
DIVERGENCE_KEYS = ("token_median_kld", "p95_kld", "p99_kld", "p999_kld", "max_kld", "mean_jsd_bits")
EXACT_TEXT = ("exact full-vocabulary KLD of this project (fp32 logits of the bf16 operands, float64 normalizers); "
              "context_bootstrap is the published percentile method applied to these exact context means")


def bin_edges() -> list[float]:
    """The published edges, ``10 ** (log10_low + i / bins_per_decade)`` in Python floats."""
    bins = round((LOG10_HIGH - LOG10_LOW) * BINS_PER_DECADE)
    return [10.0 ** (LOG10_LOW + i / BINS_PER_DECADE) for i in range(bins + 1)]


def identity_block(ident: object) -> dict[str, Any]:
    """A published ``candidate_identity`` block for this project's identity (by content) of a model."""
    fields = ident if isinstance(ident, dict) else {}
    weights = fields.get("weights")
    return {"model_path": f"fidelity:{fields.get('name', 'model')}", "model_revision": None, "model_revision_source": "none",
            "index_sha256": None, "config_sha256": fields.get("config_sha256"),
            "shard_sha256": dict(sorted(weights.items())) if isinstance(weights, dict) else None,
            "quantization": None, "quantization_config": None, "trust_remote_code": False,
            "kv_cache_dtype_requested": None, "kv_cache_dtype_resolved": "unresolved",
            "kv_cache_dtype_resolved_source": "unavailable", "fidelity_identity": ident}


def window_block(score_from: int, n_ctx: int, n_contexts: int) -> dict[str, Any]:
    """``scored_position_window`` of a report scored from row ``score_from``."""
    kept = n_ctx - 1 - score_from
    return {"schema": WINDOW_SCHEMA, "score_from": score_from, "windowed": score_from > 0,
            "policy": ("the first score_from scored positions of every context were dropped before any statistic"
                       if score_from else "no window: every scored position of every context is included"),
            "positions_per_context": kept, "positions_per_context_min": kept, "positions_per_context_max": kept,
            "capture_positions_per_context": n_ctx - 1, "dropped_positions_per_context": score_from,
            "dropped_positions_total": score_from * n_contexts, "first_scored_position_index": score_from,
            "min_left_context_tokens": score_from + 1}


def tail_block(counts: list[int], total: int, max_kld: float, min_kld: float | None, quantiles: dict[str, float]) -> dict[str, Any]:
    """``kld_tail``: the binning, the counts (underflow first, overflow last) and the exact figures."""
    edges = bin_edges()
    return {"schema": TAIL_SCHEMA, "units": "nats",
            "binning": {"log10_low": LOG10_LOW, "log10_high": LOG10_HIGH, "bins_per_decade": BINS_PER_DECADE,
                        "bins": len(edges) - 1, "edge_formula": "edges[i] = 10 ** (log10_low + i / bins_per_decade)",
                        "bucket_rule": "bucket(v) = bisect_right(bin_edges, v)",
                        "underflow": "counts[0]: v < bin_edges[0], including every exact zero",
                        "overflow": f"counts[{len(edges)}]: v >= bin_edges[-1]"},
            "bin_edges": edges, "counts": counts, "total_count": total, "underflow_count": counts[0],
            "overflow_count": counts[-1], "max_kld": max_kld, "min_kld": min_kld, "shard_exact_quantiles": quantiles}


def published_report(rep: ShardReport, *, suite: Suite, view_digest: str, head_sha256: str, vocab_size: int,
                     hidden_size: int) -> dict[str, Any]:
    """This project's exact shard report in the published ``/2`` (or windowed ``/3``) schema."""
    comp, m = rep.comparability, rep.metrics
    score_from = int(comp["score_from"])
    rows = m["contexts"]
    per_all: list[dict[str, Any]] = []
    per_ctx: list[dict[str, Any]] = []
    for r in rows:
        n = int(r["positions"])
        per_all.append({"index": r["index"], "source_cluster": str(r["cluster"]), "stratum": r["stratum"],
                        "positions_scored": n, "mean_kld": r["mean_kld"], "top1_agreement": r["top1"] / n})
        per_ctx.append({"index": r["index"], "stratum": r["stratum"], "source_cluster": str(r["cluster"]),
                        "mean_kld": r["mean_kld"], "max_kld": r["max_kld"], "mean_jsd_bits": r["sum_jsd_bits"] / n,
                        "top1_agreement": r["top1"] / n})
    means = [float(r["mean_kld"]) for r in per_all]
    strata: dict[str, list[float]] = {}
    for row in per_all:
        strata.setdefault(str(row["stratum"]), []).append(float(row["mean_kld"]))
    k = m["kld"]
    quantiles = {"p50": k["median"], "p95": k["p95"], "p99": k["p99"], "p999": k["p999"]}
    hist = [int(c) for c in m["histogram"]["counts"]]
    ref_ident, cand_ident = comp["reference"]["identity"], comp["candidate"]["identity"]
    return {
        "schema": REPORT_WINDOWED if score_from else REPORT_FULL,
        "reference": f"fidelity:{comp['reference']['name']}", "candidate": f"fidelity:{comp['candidate']['name']}",
        "reference_identity": identity_block(ref_ident), "candidate_identity": identity_block(cand_ident),
        "head": "lm-head/weight.safetensors", "head_sha256": head_sha256,
        "candidate_head": None, "candidate_head_sha256": comp.get("cand_head_sha256"),
        "suite_token_sha256": view_digest, "filter": "all",
        "scored_position_window": window_block(score_from, suite.n_ctx, len(rows)),
        "contexts": len(rows), "scored_positions": int(m["n_positions"]), "vocab_size": vocab_size, "hidden_size": hidden_size,
        "token_mean_kld": k["mean"], "token_median_kld": k["median"], "p95_kld": k["p95"], "p99_kld": k["p99"],
        "p999_kld": k["p999"], "max_kld": k["max"],
        "kld_tail": tail_block(hist, sum(hist), k["max"], None, quantiles),
        "context_macro_mean_kld": statistics.fmean(means),
        "context_bootstrap": percentile_bootstrap(means, [r["source_cluster"] for r in per_all]),
        "mean_jsd_bits": statistics.fmean(r["mean_jsd_bits"] for r in per_ctx),
        "top1_agreement": m["top1"]["agreement"],
        "strata": {s: {"contexts": len(v), "mean_kld": statistics.fmean(v)} for s, v in sorted(strata.items())},
        "worst_contexts": sorted(per_ctx, key=lambda c: -c["mean_kld"])[:20],
        "per_context_all": per_all, "per_context": per_ctx,
        "comparator": {"method": "exact", "accumulation": "float64 normalizers, fp32 logits", "two_pass": False},
        "fidelity_method": {"name": "exact", "text": EXACT_TEXT, "fidelity_report_comparability": comp},
    }


@dataclass(frozen=True)
class PublishedReport:
    """A read published report: its path, document, window, method and per-context rows."""

    path: Path
    doc: dict[str, Any]
    score_from: int
    method: str
    rows: list[dict[str, Any]]

    @property
    def tail(self) -> dict[str, Any] | None:
        t = self.doc.get("kld_tail")
        return t if isinstance(t, dict) else None


def _check_bootstrap(path: Path, boot: Any) -> None:
    """``context_bootstrap``, when present: its interval ends are divergences with ``low <= high``."""
    if not isinstance(boot, dict):
        return
    lo, hi = boot.get("ci95_low"), boot.get("ci95_high")
    if lo is None and hi is None:
        return
    low = domain.divergence(path, "context_bootstrap.ci95_low", lo)
    high = domain.divergence(path, "context_bootstrap.ci95_high", hi)
    if low > high:
        raise VerificationError(path, "context_bootstrap (ci95_low <= ci95_high)", f"low <= {high}", low)


def read_published_report(path: Path) -> PublishedReport:
    """Read and check one published report (docs/interchange.md §"The report schemas")."""
    doc = read_json(path)
    schema = doc.get("schema")
    if schema not in (REPORT_LEGACY, REPORT_FULL, REPORT_WINDOWED):
        raise VerificationError(path, "schema", f"{REPORT_FULL}, {REPORT_WINDOWED} or {REPORT_LEGACY}", schema)
    for key in REQUIRED:
        if key not in doc:
            raise VerificationError(path, f"required key {key!r}", "present", "missing")
    window = doc.get("scored_position_window")
    score_from = window.get("score_from") if isinstance(window, dict) else 0
    if not isinstance(score_from, int) or isinstance(score_from, bool) or score_from < 0:
        raise VerificationError(path, "scored_position_window.score_from", "an integer >= 0", score_from)
    if (score_from > 0) != (schema == REPORT_WINDOWED):
        raise VerificationError(path, "schema and scored_position_window.score_from",
                                f"{REPORT_WINDOWED} exactly when score_from > 0", f"{schema} with score_from {score_from}")
    rows = doc["per_context_all"]
    if not isinstance(rows, list) or not rows:
        raise VerificationError(path, "per_context_all", "a non-empty list of per-context rows", type(rows).__name__)
    seen: set[int] = set()
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or any(f not in r for f in ROW_FIELDS):
            raise VerificationError(path, f"per_context_all[{i}]", f"an object with {', '.join(ROW_FIELDS)}", r)
        where = f"per_context_all[{i}]"
        index = domain.count(path, f"{where}.index", r["index"], minimum=0)
        if index in seen:
            raise VerificationError(path, f"{where}.index", "unique indices", f"{r['index']} twice")
        seen.add(index)
        domain.count(path, f"{where}.positions_scored", r["positions_scored"])
        domain.divergence(path, f"{where}.mean_kld", r["mean_kld"])
        domain.fraction(path, f"{where}.top1_agreement", r["top1_agreement"])
    positions = sum(int(r["positions_scored"]) for r in rows)
    stated = (domain.count(path, "scored_positions", doc["scored_positions"]), domain.count(path, "contexts", doc["contexts"]))
    if positions != stated[0] or len(rows) != stated[1]:
        raise VerificationError(path, "scored_positions and contexts (its per_context_all rows)", (positions, len(rows)), stated)
    mean = domain.fsum(path, "sum of per_context_all mean_kld x positions_scored",
                       (float(r["mean_kld"]) * int(r["positions_scored"]) for r in rows)) / positions
    top1 = math.fsum(float(r["top1_agreement"]) * int(r["positions_scored"]) for r in rows) / positions
    macro = domain.fsum(path, "sum of per_context_all mean_kld", (float(r["mean_kld"]) for r in rows)) / len(rows)
    domain.divergence(path, "token_mean_kld", doc["token_mean_kld"])
    domain.divergence(path, "context_macro_mean_kld", doc["context_macro_mean_kld"])
    domain.fraction(path, "top1_agreement", doc["top1_agreement"])
    for key, want in (("token_mean_kld", mean), ("top1_agreement", top1), ("context_macro_mean_kld", macro)):
        domain.rederived(path, key, doc[key], want, TOLERANCE)
    for key in DIVERGENCE_KEYS:  # optional headline figures: when present, divergences
        if doc.get(key) is not None:
            domain.divergence(path, key, doc[key])
    _check_bootstrap(path, doc.get("context_bootstrap"))
    tail = doc.get("kld_tail")
    if schema != REPORT_LEGACY:
        counts = tail.get("counts") if isinstance(tail, dict) else None
        if not isinstance(counts, list):
            raise VerificationError(path, "kld_tail.counts", "a list of bin counts", counts)
        total = sum(domain.count(path, f"kld_tail.counts[{k}]", c, minimum=0) for k, c in enumerate(counts))
        if total != positions:
            raise VerificationError(path, "kld_tail.counts (sum: the scored positions)", positions, total)
        assert isinstance(tail, dict)
        if tail.get("max_kld") is not None:
            domain.divergence(path, "kld_tail.max_kld", tail["max_kld"])
    marker = doc.get("fidelity_method")
    method = marker.get("name") if isinstance(marker, dict) else "published"
    if method not in ("exact", "published"):
        raise VerificationError(path, "fidelity_method.name", "exact or published", method)
    return PublishedReport(path=path, doc=doc, score_from=score_from, method=str(method), rows=list(rows))
