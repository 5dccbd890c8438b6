"""The published ladder receipts read as inputs: ``qwen38-kld-ladder-cumulative/2`` and ``/3`` (one candidate's
shards welded into one receipt, every per-context row kept) and ``qwen38-kld-ladder-paired/1`` and ``/2``.

Refused, each as a :class:`~harness.errors.VerificationError` naming the file, the field, the expected and the
found value: an unknown schema; a ``content_sha256`` that is not the canonical digest of the receipt less
its ``content_sha256_excludes`` (and the list itself); a number outside its meaning (a negative KLD, a count
that is not positive, a top-1 share beyond its positions, anything not finite); totals, token means, top-1,
the macro mean, strata and cluster counts that do not follow from the rows; a summed tail that does not
count the scored positions; and, against the suite manifest, a context it lacks, another cluster or stratum,
other positions per context, another ``suite_token_sha256`` or manifest digest, a shard whose digest is not
its contexts' lineage. docs/qwen38-receipts.md walks through them.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import VerificationError
from harness.interchange.manifest_read import SuiteManifest, check_model_identity
from harness.io import domain
from harness.io.jsonio import read_json

CUMULATIVE_SCHEMAS = ("qwen38-kld-ladder-cumulative/2", "qwen38-kld-ladder-cumulative/3")
PAIRED_SCHEMAS = ("qwen38-kld-ladder-paired/1", "qwen38-kld-ladder-paired/2")
#: What a paired receipt's digest leaves out (it carries no ``content_sha256_excludes``).
PAIRED_EXCLUDES = ("generated_utc", "content_sha256")
#: A row's mean times its positions is a count of top-1 hits: within this of an integer (float64 rounding).
HITS_TOLERANCE = 1e-6
#: Relative gap within which a receipt's headline equals the one re-derived from its rows: both are ``math.fsum``
#: over the same float64 products, so only a different order of the rows moves the last bits.
RECEIPT_TOLERANCE = 1e-12


@dataclass(frozen=True)
class ReceiptRow:
    """One context of a receipt: ``index``, ``source_cluster``, ``stratum``, ``positions`` scored,
    ``mean_kld`` (nats), ``top1`` (agreement share)."""

    index: int
    source_cluster: str
    stratum: str
    positions: int
    mean_kld: float
    top1: float


@dataclass(frozen=True)
class CumulativeReceipt:
    """A checked cumulative receipt: its ``path``, ``doc``, ``candidate``, ``rows`` (in index order), ``score_from``."""

    path: Path
    doc: Mapping[str, Any]
    candidate: str
    rows: tuple[ReceiptRow, ...]
    score_from: int


def canonical_sha256(payload: Mapping[str, Any]) -> str:
    """sha256 of the payload as sorted-key compact JSON (the published tools' ``content_sha256``)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_content_digest(path: Path, doc: Mapping[str, Any], excludes: Sequence[str]) -> None:
    """``content_sha256`` is the canonical digest of ``doc`` less ``excludes``."""
    want = canonical_sha256({k: v for k, v in doc.items() if k not in excludes})
    if doc.get("content_sha256") != want:
        raise VerificationError(path, f"content_sha256 (sha256 of the receipt less {', '.join(excludes)})", want,
                                doc.get("content_sha256"), "the receipt was changed after it was sealed")


def schema_of(path: Path) -> str | None:
    """The ``schema`` of a JSON object file (None when it is not one)."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return str(doc.get("schema")) if isinstance(doc, dict) else None


def is_ladder_receipt(path: Path) -> bool:
    """True when ``path`` is a cumulative or paired ladder receipt (any version: unknown ones are refused later)."""
    s = schema_of(path) if path.suffix == ".json" and path.is_file() else None
    return s is not None and s.startswith(("qwen38-kld-ladder-cumulative/", "qwen38-kld-ladder-paired/"))


def _row(path: Path, k: int, raw: Any, positions_each: int | None) -> ReceiptRow:
    w = f"per_context_all[{k}]"
    if not isinstance(raw, dict):
        raise VerificationError(path, w, "an object", type(raw).__name__)
    for key in ("index", "source_cluster", "stratum", "positions_scored", "mean_kld", "top1_agreement"):
        if key not in raw:
            raise VerificationError(path, f"{w}.{key}", "present", "missing")
    n = domain.count(path, f"{w}.positions_scored", raw["positions_scored"])
    if positions_each is not None and n != positions_each:
        raise VerificationError(path, f"{w}.positions_scored (the suite's positions per context less the window)", positions_each, n)
    top1 = domain.fraction(path, f"{w}.top1_agreement", raw["top1_agreement"])
    hits = top1 * n
    if abs(hits - round(hits)) > HITS_TOLERANCE * max(1.0, hits):
        raise VerificationError(path, f"{w}.top1_agreement x positions_scored (a count of top-1 hits)", "an integer", hits)
    domain.at_most(path, f"{w} top-1 hits", round(hits), n, "its positions_scored")
    if "median_kld" in raw:
        domain.divergence(path, f"{w}.median_kld", raw["median_kld"])
    return ReceiptRow(index=domain.count(path, f"{w}.index", raw["index"], minimum=0), source_cluster=str(raw["source_cluster"]),
                      stratum=str(raw["stratum"]), positions=n,
                      mean_kld=domain.divergence(path, f"{w}.mean_kld", raw["mean_kld"]), top1=top1)


def _window(path: Path, doc: Mapping[str, Any]) -> int:
    """``score_from`` of the receipt (``/2`` predates the block: every position, 0)."""
    block = doc.get("scored_position_window")
    if block is None:
        if doc["schema"] != CUMULATIVE_SCHEMAS[0]:
            raise VerificationError(path, "scored_position_window", f"an object ({doc['schema']} declares its window)", "missing")
        return 0
    if not isinstance(block, dict):
        raise VerificationError(path, "scored_position_window", "an object", type(block).__name__)
    return domain.count(path, "scored_position_window.score_from", block.get("score_from"), minimum=0)


def _close(path: Path, what: str, stated: Any, derived: float) -> None:
    domain.rederived(path, what, stated, derived, rel_tol=RECEIPT_TOLERANCE, abs_tol=1e-300)


def _totals(path: Path, doc: Mapping[str, Any], rows: list[ReceiptRow]) -> None:
    """Every headline of the receipt follows from its rows."""
    n = sum(r.positions for r in rows)
    if domain.count(path, "contexts", doc.get("contexts")) != len(rows):
        raise VerificationError(path, "contexts (the per_context_all rows)", len(rows), doc.get("contexts"))
    if domain.count(path, "scored_positions", doc.get("scored_positions")) != n:
        raise VerificationError(path, "scored_positions (the rows' positions_scored summed)", n, doc.get("scored_positions"))
    clusters = {r.source_cluster for r in rows}
    if domain.count(path, "source_clusters", doc.get("source_clusters")) != len(clusters):
        raise VerificationError(path, "source_clusters (distinct clusters of the rows)", len(clusters), doc.get("source_clusters"))
    domain.divergence(path, "token_mean_kld", doc.get("token_mean_kld"))
    _close(path, "token_mean_kld", doc["token_mean_kld"], domain.fsum(path, "rows' KLD sums", (r.mean_kld * r.positions for r in rows)) / n)
    domain.fraction(path, "top1_agreement", doc.get("top1_agreement"))
    _close(path, "top1_agreement", doc["top1_agreement"], domain.fsum(path, "rows' top-1 hits", (r.top1 * r.positions for r in rows)) / n)
    macro = statistics.fmean(r.mean_kld for r in rows)
    _close(path, "context_macro_mean_kld", doc.get("context_macro_mean_kld"), macro)
    boot = doc.get("context_bootstrap")
    if not isinstance(boot, dict):
        raise VerificationError(path, "context_bootstrap", "an object", type(boot).__name__)
    _close(path, "context_bootstrap.mean", boot.get("mean"), macro)
    if boot.get("clusters") != len(clusters):
        raise VerificationError(path, "context_bootstrap.clusters (distinct clusters of the rows)", len(clusters), boot.get("clusters"))
    for side in ("ci95_low", "ci95_high"):
        domain.divergence(path, f"context_bootstrap.{side}", boot.get(side))
    strata = doc.get("strata")
    if isinstance(strata, dict):
        for name, count in Counter(r.stratum for r in rows).items():
            st = strata.get(name)
            if not isinstance(st, dict) or st.get("contexts") != count:
                raise VerificationError(path, f"strata.{name}.contexts (the rows of that stratum)", count,
                                        st.get("contexts") if isinstance(st, dict) else st)
        if set(strata) != {r.stratum for r in rows}:
            raise VerificationError(path, "strata (the rows' strata)", sorted({r.stratum for r in rows}), sorted(strata))
    if doc.get("max_kld") is not None:
        domain.divergence(path, "max_kld", doc["max_kld"])


def _tail(path: Path, doc: Mapping[str, Any]) -> None:
    """A summed tail (when present) counts exactly the scored positions, and its maximum is the receipt's."""
    tail = doc.get("tail")
    if tail is None:
        return
    if not isinstance(tail, dict):
        raise VerificationError(path, "tail", "an object or null", type(tail).__name__)
    edges, counts = tail.get("bin_edges"), tail.get("counts")
    if not isinstance(edges, list) or not isinstance(counts, list) or len(counts) != len(edges) + 1:
        raise VerificationError(path, "tail.counts", "one count per bin, plus underflow and overflow",
                                f"{len(counts) if isinstance(counts, list) else counts} for "
                                f"{len(edges) if isinstance(edges, list) else edges} edges")
    e = [domain.finite(path, f"tail.bin_edges[{i}]", x) for i, x in enumerate(edges)]
    if any(b <= a for a, b in zip(e, e[1:])):
        raise VerificationError(path, "tail.bin_edges", "strictly ascending", "not ascending")
    c = [domain.count(path, f"tail.counts[{i}]", x, minimum=0) for i, x in enumerate(counts)]
    if tail.get("total_count") != sum(c):
        raise VerificationError(path, "tail.total_count (its counts summed)", sum(c), tail.get("total_count"))
    if sum(c) != doc["scored_positions"]:
        raise VerificationError(path, "tail counts (one per scored position)", doc["scored_positions"], sum(c))
    top = domain.divergence(path, "tail.max_kld_exact", tail.get("max_kld_exact"))
    if doc.get("max_kld") is not None and top != doc["max_kld"]:
        raise VerificationError(path, "tail.max_kld_exact (the receipt's max_kld)", doc["max_kld"], top)


def _against_manifest(path: Path, doc: Mapping[str, Any], rows: list[ReceiptRow], m: SuiteManifest) -> None:
    """The receipt's suite is ``m``: digests, contexts, clusters, strata and each shard's lineage."""
    parent = (doc.get("suite") or {}).get("parent") or {}
    if parent.get("suite_token_sha256") != m.suite_token_sha256:
        raise VerificationError(path, f"suite.parent.suite_token_sha256 (that of {m.path})", m.suite_token_sha256,
                                parent.get("suite_token_sha256"), "a receipt of another suite")
    if parent.get("manifest_sha256") != m.sha256:
        raise VerificationError(path, f"suite.parent.manifest_sha256 (sha256 of {m.path})", m.sha256, parent.get("manifest_sha256"))
    if parent.get("contexts") not in (None, len(m.rows)):
        raise VerificationError(path, "suite.parent.contexts (the manifest's)", len(m.rows), parent.get("contexts"))
    ref = doc.get("reference_identity")
    check_model_identity(m, f"{path}: reference_identity", config_sha256=ref.get("config_sha256") if isinstance(ref, dict) else None)
    for r in rows:
        mr = m.row(r.index)
        if mr is None:
            raise VerificationError(path, f"context {r.index} (a context of {m.path})", f"0..{len(m.rows) - 1}", r.index)
        if (mr.source_cluster, mr.stratum) != (r.source_cluster, r.stratum):
            raise VerificationError(path, f"source_cluster, stratum of context {r.index} (the manifest's)",
                                    (mr.source_cluster, mr.stratum), (r.source_cluster, r.stratum))
    for k, sh in enumerate(doc.get("shards") or []):
        lo, hi = sh.get("context_index_min"), sh.get("context_index_max")
        if not (isinstance(lo, int) and isinstance(hi, int) and sh.get("contexts") == hi - lo + 1):
            raise VerificationError(path, f"shards[{k}] (contexts context_index_min..max)", "a consecutive range",
                                    f"{sh.get('contexts')} contexts for {lo}..{hi}")
        want = m.lineage_digest(range(lo, hi + 1))
        if sh.get("suite_token_sha256") != want:
            raise VerificationError(path, f"shards[{k}].suite_token_sha256 (lineage of contexts {lo}..{hi} in {m.path})", want,
                                    sh.get("suite_token_sha256"))


def read_cumulative(path: Path, manifest: SuiteManifest | None = None) -> CumulativeReceipt:
    """Read and check one cumulative receipt (module docstring); with ``manifest``, against that suite."""
    doc = read_json(path, expect=dict)
    if doc.get("schema") not in CUMULATIVE_SCHEMAS:
        raise VerificationError(path, "schema (a cumulative ladder receipt)", " or ".join(CUMULATIVE_SCHEMAS), repr(doc.get("schema")))
    excludes = doc.get("content_sha256_excludes")
    if not (isinstance(excludes, list) and "content_sha256" in excludes and all(isinstance(x, str) for x in excludes)):
        raise VerificationError(path, "content_sha256_excludes", "a list of field names holding content_sha256", repr(excludes))
    check_content_digest(path, doc, [*excludes, "content_sha256_excludes"])
    score_from = _window(path, doc)
    raw = doc.get("per_context_all")
    if not isinstance(raw, list) or not raw:
        raise VerificationError(path, "per_context_all", "the per-context rows (a non-empty list)", type(raw).__name__)
    each = None if manifest is None else manifest.scored_positions_per_context - score_from
    rows = [_row(path, k, r, each) for k, r in enumerate(raw)]
    seen = Counter(r.index for r in rows)
    twice = sorted(i for i, n in seen.items() if n > 1)
    if twice:
        raise VerificationError(path, f"context {twice[0]}", "in one row only", f"in {seen[twice[0]]} rows")
    _totals(path, doc, rows)
    _tail(path, doc)
    if manifest is not None:
        _against_manifest(path, doc, rows, manifest)
    return CumulativeReceipt(path=path, doc=doc, candidate=str(doc.get("candidate")), rows=tuple(sorted(rows, key=lambda r: r.index)),
                             score_from=score_from)


def read_paired(path: Path) -> Mapping[str, Any]:
    """A paired receipt, its schema and digest checked and every comparison's numbers within their meaning."""
    doc: dict[str, Any] = read_json(path, expect=dict)
    if doc.get("schema") not in PAIRED_SCHEMAS:
        raise VerificationError(path, "schema (a paired ladder receipt)", " or ".join(PAIRED_SCHEMAS), repr(doc.get("schema")))
    check_content_digest(path, doc, PAIRED_EXCLUDES)
    comps = doc.get("comparisons")
    inputs = doc.get("inputs")
    if not isinstance(comps, dict) or not comps or not isinstance(inputs, dict):
        raise VerificationError(path, "comparisons, inputs", "two objects, comparisons not empty", f"{type(comps).__name__}, {type(inputs).__name__}")
    for key, c in comps.items():
        if not isinstance(c, dict) or c.get("a") not in inputs or c.get("b") not in inputs:
            raise VerificationError(path, f"comparisons.{key}.a/b (labels of inputs)", sorted(inputs), repr(c))
        n = domain.count(path, f"comparisons.{key}.contexts", c.get("contexts"))
        wins = [domain.count(path, f"comparisons.{key}.{w}", c.get(w, 0), minimum=0) for w in ("a_wins", "b_wins", "ties")]
        domain.at_most(path, f"comparisons.{key} a_wins + b_wins + ties", sum(wins), n, "its contexts")
        domain.count(path, f"comparisons.{key}.clusters", c.get("clusters"))
        lo, d, hi = (domain.finite(path, f"comparisons.{key}.{f}", c.get(f)) for f in ("ci95_low", "difference_a_minus_b", "ci95_high"))
        if not lo <= hi:
            raise VerificationError(path, f"comparisons.{key} interval", "ci95_low <= ci95_high", [lo, hi])
        if not math.isfinite(d):
            raise VerificationError(path, f"comparisons.{key}.difference_a_minus_b", "finite", d)
    return doc
