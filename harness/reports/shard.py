"""Shard report (docs/design.md, sections 2-4): one candidate on one shard, as JSON plus a Markdown rendering.

Reasoning: docs/design.md §"Shard reports".
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict, TypeGuard

from harness import PROTOCOL_VERSION, __version__
from harness.errors import VerificationError
from harness.io import domain
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.jsonio import read_json
from harness.io.md_table import md_table
from harness.io.schema import MapOf, Nullable, Optional, check, checked, schema_of
from harness.metrics.records import ShardSummary
from harness.reports.diagnostics import diagnostics_lines
from harness.reports.numbers import fmt_interval as _interval
from harness.reports.numbers import fmt_value as _g

SCHEMA = "fidelity.shard-report/1"

COMPARABILITY_KEYS = (
    "protocol_version",
    "harness_version",
    "suite_token_sha256",
    "shard",
    "score_from",
    "reference",
    "candidate",
    "head_sha256",
    "cand_head_sha256",
    "engine",
    "scorer",
)
#: Keys that must be equal across the shards of one aggregate (the shard itself differs).
AGGREGATE_KEYS = tuple(k for k in COMPARABILITY_KEYS if k != "shard")
REQUIRED_METRICS = ("n_positions", "n_contexts", "n_clusters", "score_from", "bootstrap", "kld", "top1", "ear", "contexts",
                    "totals")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


#: An identity block of the comparability (reference, candidate, engine, scorer, custody): JSON its producer
#: writes, compared whole; a reader takes a field out with a type check (:func:`identity_field`).
Identity = dict[str, object]


class ShardRef(TypedDict):
    """A shard of the suite: its index and the SHA-256 of its token file."""

    index: int
    sha256: str


class SetComparability(TypedDict):
    """The comparability fields every shard of one aggregate shares (module docstring; all but ``shard``)."""

    protocol_version: int
    harness_version: str
    suite_token_sha256: str
    score_from: int
    reference: Identity
    candidate: Identity
    head_sha256: str | None
    cand_head_sha256: str | None
    engine: Identity
    scorer: Identity
    #: the published digests of a dataset read in another layout (absent otherwise)
    custody: NotRequired[Identity]


class Comparability(SetComparability):
    """A shard report's ``comparability`` block: the set's fields and the shard itself."""

    shard: ShardRef


class ShardReportJSON(TypedDict):
    """A shard report as written to ``<candidate>.shard<NNN>.json`` (module docstring)."""

    schema: str
    candidate: str
    comparability: Comparability
    metrics: ShardSummary
    timing: dict[str, float | str]
    created: str


def identity_field(block: Identity, key: str) -> object:
    """``block[key]`` of an identity block (None when absent)."""
    return block.get(key)


def set_comparability(comp: Comparability) -> SetComparability:
    """The fields of ``comp`` that an aggregate's shards share (all but ``shard``)."""
    out: SetComparability = {
        "protocol_version": comp["protocol_version"], "harness_version": comp["harness_version"],
        "suite_token_sha256": comp["suite_token_sha256"], "score_from": comp["score_from"],
        "reference": comp["reference"], "candidate": comp["candidate"], "head_sha256": comp["head_sha256"],
        "cand_head_sha256": comp["cand_head_sha256"], "engine": comp["engine"], "scorer": comp["scorer"],
    }
    if "custody" in comp:
        out["custody"] = comp["custody"]
    return out


def make_comparability(
    *,
    suite_token_sha256: str,
    shard_index: int,
    shard_sha256: str,
    score_from: int,
    reference: Identity,
    candidate: Identity,
    head_sha256: str | None,
    engine: Identity,
    scorer: Identity,
    cand_head_sha256: str | None = None,
    custody: Mapping[str, object] | None = None,
) -> Comparability:
    """The ``comparability`` block, with this harness's protocol and version filled in.

    ``custody``: the published digests of a dataset read in another layout (:mod:`harness.interchange`),
    kept as ``custody`` so the report names the exact files it was verified against; absent otherwise."""
    comp: Comparability = {
        "protocol_version": PROTOCOL_VERSION,
        "harness_version": __version__,
        "suite_token_sha256": suite_token_sha256,
        "shard": {"index": int(shard_index), "sha256": shard_sha256},
        "score_from": int(score_from),
        "reference": reference,
        "candidate": candidate,
        "head_sha256": head_sha256,
        "cand_head_sha256": cand_head_sha256,
        "engine": engine,
        "scorer": scorer,
    }
    if custody is not None:
        comp["custody"] = dict(custody)
    return comp


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def _freeze(v: object) -> object:
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


@dataclass
class ShardReport:
    candidate: str
    comparability: Comparability
    metrics: ShardSummary
    timing: dict[str, float | str] = field(default_factory=dict, compare=False)
    created: str = field(default_factory=_now, compare=False)
    schema: str = SCHEMA
    #: where the report was read from (named in fail-closed errors); never written
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.candidate):
            raise ValueError(f"candidate name: expected [A-Za-z0-9._+-] starting alphanumeric, found {self.candidate!r}")

    # ---- identity -------------------------------------------------------------------------
    def comparable_key(self) -> tuple[object, ...]:
        """Hashable key of the fields that must match to aggregate this report with other shards
        (everything in ``comparability`` except the shard's own index and hash)."""
        comp: dict[str, object] = dict(self.comparability)
        return (self.schema,) + tuple((k, _freeze(comp.get(k))) for k in AGGREGATE_KEYS)

    @property
    def stem(self) -> str:
        return f"{self.candidate}.shard{self.comparability['shard']['index']:03d}"

    # ---- JSON -----------------------------------------------------------------------------
    def to_json_dict(self) -> ShardReportJSON:
        return {
            "schema": self.schema,
            "candidate": self.candidate,
            "comparability": self.comparability,
            "metrics": self.metrics,
            "timing": self.timing,
            "created": self.created,
        }

    @classmethod
    def from_json_dict(cls, d: object, path: str | Path = "<memory>") -> ShardReport:
        if not isinstance(d, dict):
            raise VerificationError(path, "report", "a JSON object", type(d).__name__)
        check_finite(d, path)
        if d.get("schema") != SCHEMA:
            raise VerificationError(path, "schema", SCHEMA, d.get("schema"), "re-run the scorer with this harness version")
        for k in ("candidate", "comparability", "metrics"):
            if k not in d:
                raise VerificationError(path, f"required key {k!r}", "present", "missing")
        comp = d["comparability"]
        if not isinstance(comp, dict):
            raise VerificationError(path, "comparability", "an object", type(comp).__name__)
        for k in COMPARABILITY_KEYS:
            if k not in comp:
                raise VerificationError(path, f"required key 'comparability.{k}'", "present", "missing")
        m = d["metrics"]
        if not isinstance(m, dict):
            raise VerificationError(path, "metrics", "an object", type(m).__name__)
        for k in REQUIRED_METRICS:
            if k not in m:
                raise VerificationError(path, f"required key 'metrics.{k}'", "present", "missing")
        if m["score_from"] != comp["score_from"]:
            raise VerificationError(path, "metrics.score_from", comp["score_from"], m["score_from"], "window mismatch")
        _check_types(d, path)
        doc = checked(d, _StoredReport, path)
        try:
            return cls(
                candidate=doc["candidate"],
                comparability=doc["comparability"],
                metrics=doc["metrics"],
                timing=doc.get("timing", {}),
                created=doc.get("created", ""),
            )
        except ValueError as e:
            raise VerificationError(path, "candidate", "a valid name", d["candidate"], str(e)) from None

    # ---- files ----------------------------------------------------------------------------
    def write(self, dir_or_path: str | Path) -> tuple[Path, Path]:
        """Atomically write ``<stem>.json`` and ``<stem>.md`` into a folder (or next to a given ``.json`` path)."""
        p = Path(dir_or_path)
        json_path = p if p.suffix == ".json" else p / f"{self.stem}.json"
        md_path = json_path.with_suffix(".md")
        atomic_write_files({json_path: dumps_json(self.to_json_dict()), md_path: render_markdown(self)})  # both or neither
        return json_path, md_path

    @classmethod
    def load(cls, path: str | Path) -> ShardReport:
        path = Path(path)
        d = read_json(path)
        return cls.from_json_dict(d, path)


def check_finite(obj: object, path: str | Path, where: str = "$") -> None:
    """Refuse NaN/Inf anywhere in a report (``1e999`` parses to inf without ``parse_constant``)."""
    stack: list[tuple[object, str]] = [(obj, where)]
    while stack:
        v, w = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise VerificationError(path, f"number at {w}", "finite", repr(v))
        if isinstance(v, dict):
            stack.extend((x, f"{w}.{k}") for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{w}[{i}]") for i, x in enumerate(v))


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


#: The blocks of a shard report that consumers (aggregate, ladder, gate, plan) add up or read
#: (:mod:`harness.io.schema`); ``diagnostics`` is absent in reports that predate it, whole when present.
_HISTOGRAM = {"counts": [int], "spec": {"bins_per_decade": int, "hi": float, "kind": str, "lo": float, "n_counts": int}}
_BINNED = {"counts": [int], "sum_kld": [float]}
METRICS_SCHEMA = {
    "totals": {
        "n_positions": int, "sum_kld": float, "sum_jsd_bits": float, "sum_ear": float, "sum_nll_ref": float,
        "sum_nll_cand": float, "max_kld": float, "top1_count": int, "exceedance": MapOf(int), "histogram": _HISTOGRAM,
        "diagnostics": Optional({
            "by_confidence": {**_BINNED, "edges": [float], "top1_count": [int]},
            "by_entropy": {**_BINNED, "spec": {"bins_per_decade": int, "hi": float, "kind": str, "lo": float, "n_counts": int}},
            "sum_entropy_ref": float, "sum_kld_rev": float, "sum_p_ref_top": float, "sum_q_ref_top": float,
            "top10_shared": int, "top5_shared": int,
        }),
    },
    "histogram": _HISTOGRAM,
    "top1": {"agreement": float, "count": int, "ci95": Nullable([float])},
    "contexts": [{"index": int, "cluster": str, "stratum": str, "positions": int, "sum_kld": float, "mean_kld": float,
                  "max_kld": float, "sum_jsd_bits": float, "sum_ear": float, "sum_nll_ref": float, "sum_nll_cand": float,
                  "top1": int, "sum_kld_rev": Optional(float), "top5_shared": Optional(int), "top10_shared": Optional(int)}],
}


#: The whole ``metrics`` record as :class:`~harness.metrics.records.ShardSummary` declares it, nested records
#: included (harness.io.schema.schema_of): a report missing a block, or holding a value of another type
#: anywhere in it, is refused when it is read, never a ``KeyError`` in a consumer.
SUMMARY_SCHEMA = schema_of(ShardSummary)


class _StoredReport(TypedDict):
    """A shard report as read: :class:`ShardReportJSON` whose ``timing`` and ``created`` may be absent."""

    schema: str
    candidate: str
    comparability: Comparability
    metrics: ShardSummary
    timing: NotRequired[dict[str, float | str]]
    created: NotRequired[str]


def _check_types(d: dict[str, Any], path: str | Path) -> None:  # Any: a JSON document before its schema check
    """Types of the fields that consumers (aggregate, ladder, gate) read, so they never crash on a bad file."""
    comp, m = d["comparability"], d["metrics"]
    if not isinstance(d["candidate"], str):
        raise VerificationError(path, "candidate", "a string", type(d["candidate"]).__name__)
    shard = comp["shard"]
    if not (isinstance(shard, dict) and _is_int(shard.get("index")) and shard["index"] >= 0 and isinstance(shard.get("sha256"), str)):
        raise VerificationError(path, "comparability.shard", "{index: int >= 0, sha256: str}", shard)
    if not _is_int(comp["score_from"]) or comp["score_from"] < 0:
        raise VerificationError(path, "comparability.score_from", "an integer >= 0", comp["score_from"])
    for k in ("n_positions", "n_contexts", "n_clusters"):
        if not _is_int(m[k]) or m[k] < 0:
            raise VerificationError(path, f"metrics.{k}", "an integer >= 0", m[k])
    for k, sub in (("kld", "mean"), ("top1", "agreement"), ("ear", "mean")):
        if not isinstance(m[k], dict) or isinstance(m[k].get(sub), bool) or not isinstance(m[k].get(sub), (int, float)):
            raise VerificationError(path, f"metrics.{k}.{sub}", "a number", m[k].get(sub) if isinstance(m[k], dict) else m[k])
    if not isinstance(m["totals"], dict):
        raise VerificationError(path, "metrics.totals", "an object", type(m["totals"]).__name__)
    rows = m["contexts"]
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise VerificationError(path, "metrics.contexts", "a list of per-context objects", type(rows).__name__)
    check(m, METRICS_SCHEMA, path, "metrics")
    check(m, SUMMARY_SCHEMA, path, "metrics")
    _check_domains(m, path)


def _check_domains(m: dict[str, Any], path: str | Path) -> None:  # Any: a JSON document before its schema check
    """Every number for its meaning (:mod:`harness.io.domain`), and the headline re-derived from the rows:
    per-context positions >= 1, divergences >= 0, top-1 counts within their positions; ``kld.mean`` and
    ``top1.agreement`` follow from ``totals`` (the rows are reconciled with ``totals`` by the aggregator)."""
    rows, t = m["contexts"], m["totals"]
    for i, r in enumerate(rows):
        w = f"metrics.contexts[{i}]"
        n = domain.count(path, f"{w}.positions", r["positions"])
        for k in ("sum_kld", "mean_kld", "max_kld", "sum_jsd_bits"):
            domain.divergence(path, f"{w}.{k}", r[k])
        domain.at_most(path, f"{w}.top1", domain.count(path, f"{w}.top1", r["top1"], minimum=0), n, "its positions")
    n_pos = domain.count(path, "metrics.totals.n_positions", t["n_positions"], minimum=0)
    for k in ("sum_kld", "max_kld", "sum_jsd_bits"):
        domain.divergence(path, f"metrics.totals.{k}", t[k])
    domain.at_most(path, "metrics.totals.top1_count", domain.count(path, "metrics.totals.top1_count", t["top1_count"], minimum=0),
                   n_pos, "metrics.totals.n_positions")
    if n_pos == 0:
        return
    domain.rederived(path, "metrics.kld.mean", m["kld"]["mean"], float(t["sum_kld"]) / n_pos, abs_tol=1e-12,
                     source="metrics.totals")
    domain.rederived(path, "metrics.top1.agreement", m["top1"]["agreement"], int(t["top1_count"]) / n_pos, abs_tol=1e-12,
                     source="metrics.totals")


# ---- Markdown ---------------------------------------------------------------------------------


def render_markdown(r: ShardReport) -> str:
    m = r.metrics
    k = m["kld"]
    bs = m.get("bootstrap", {})
    lines = [f"# {r.candidate} — shard report", ""]
    lines += [
        f"{m['n_positions']} positions in {m['n_contexts']} contexts from {m['n_clusters']} source clusters; "
        f"window score_from={m['score_from']}.",
        "",
        "## Headline",
        "",
    ]
    headline = [
        ["mean KLD (nats, token mean)", _g(k["mean"]), _interval(k.get("ci95"))],
        ["mean KLD (context macro)", _g(k.get("mean_context_macro")), ""],
        ["top-1 agreement", _g(m["top1"]["agreement"]), _interval(m["top1"].get("ci95"))],
        ["EAR", _g(m["ear"]["mean"]), _interval(m["ear"].get("ci95"))],
    ]
    if "jsd_bits" in m:
        headline.append(["mean JSD (bits)", _g(m["jsd_bits"]["mean"]), _interval(m["jsd_bits"].get("ci95"))])
    if "ppl" in m:
        p = m["ppl"]
        headline.append(["PPL ref / cand", f"{_g(p['ref'], 6)} / {_g(p['cand'], 6)}", ""])
        headline.append(["mean ln(PPL(cand)/PPL(ref))", _g(p["mean_ln_ratio"]), ""])
    lines += md_table(["metric", "value", "95% interval"], headline)
    lines += [
        "",
        f"Intervals: means {bs.get('method_text', bs.get('method', 'source-cluster bootstrap'))}; tails "
        f"{bs.get('tail_method', 'percentile')}; {bs.get('n_boot', '?')} replicates "
        f"({bs.get('n_boot_tails', '?')} for tails), seed {bs.get('seed', '?')}. "
        + ("" if bs.get("estimable", True) else
           f"**Not estimable: {m['n_clusters']} source clusters, fewer than the {bs.get('min_clusters')} an interval needs.** ")
        + f"Naive i.i.d. SE of the mean (for comparison only): {_g(k.get('se_iid'))}.",
        "",
        f"Resolvable δ (95% confidence, 80% power, two independent candidates with this run's cluster spread; "
        f"a paired comparison resolves less): {_g(m.get('resolvable_delta'))} nats.",
        "",
        "## Tails",
        "",
        *md_table(["median", "p95", "p99", "p99.9", "CVaR1%", "max"],
                  [[_g(k.get(q)) for q in ("median", "p95", "p99", "p999", "cvar1", "max")]]),
        "",
        (f"p99 interval {_interval(k.get('p99_ci95'))}; CVaR1% interval {_interval(k.get('cvar1_ci95'))}."
         if k.get("p99_ci95") or bs.get("tail_estimable", True) else
         f"p99 and CVaR1% intervals not estimable: {m['n_clusters']} source clusters, fewer than the "
         f"{bs.get('tail_min_clusters')} at which their coverage holds (docs/statistics.md)."),
        "",
    ]
    if "diagnostics" in m:
        lines += diagnostics_lines(m["diagnostics"])
    if "exceedance" in m:
        lines += md_table(["KLD >", *m["exceedance"]], [["positions", *m["exceedance"].values()]]) + [""]
    if "histogram" in m:
        counts = m["histogram"]["counts"]
        spec = m["histogram"]["spec"]
        per = spec["bins_per_decade"]
        lo_exp = round(math.log10(spec["lo"]))
        inner = counts[1:-1]
        decades = [[f"[1e{lo_exp + d}, 1e{lo_exp + d + 1})", c] for d in range(len(inner) // per)
                   if (c := sum(inner[d * per : (d + 1) * per]))]
        lines += ["## Histogram (per decade)", ""]
        lines += md_table(["range (nats)", "positions"],
                          [[f"< {spec['lo']:g}", counts[0]], *decades, [f">= {spec['hi']:g}", counts[-1]]]) + [""]
    if m.get("per_stratum"):
        lines += ["## Per stratum", ""]
        lines += md_table(["stratum", "contexts", "positions", "mean KLD", "top-1"],
                          [[name, s["contexts"], s["positions"], _g(s["mean_kld"]), _g(s["top1"])]
                           for name, s in m["per_stratum"].items()]) + [""]
    if m.get("worst_contexts"):
        lines += ["## Worst contexts", ""]
        lines += md_table(["context", "cluster", "stratum", "mean KLD", "max KLD"],
                          [[row["index"], row["cluster"], row["stratum"], _g(row["mean_kld"]), _g(row.get("max_kld"))]
                           for row in m["worst_contexts"]]) + [""]
    lines += ["## Identity", ""]
    lines += md_table(["field", "value"],
                      [[key, f"`{json.dumps(r.comparability.get(key), sort_keys=True)}`"] for key in COMPARABILITY_KEYS])
    lines += ["", f"Schema {r.schema}; created {r.created}."]
    if r.timing:
        lines.append("Timing: " + ", ".join(f"{k} {_g(v)}" for k, v in sorted(r.timing.items())) + ".")
    return "\n".join(lines) + "\n"


__all__ = ["SCHEMA", "ShardReport", "make_comparability", "COMPARABILITY_KEYS", "AGGREGATE_KEYS", "render_markdown"]


def report_shard(report: ShardReport) -> int:
    """The shard number of a :class:`~harness.reports.shard.ShardReport`."""
    return int(report.comparability["shard"]["index"])
