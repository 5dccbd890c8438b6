"""Committed threshold baselines: one human-readable JSON file per candidate (``fidelity.baseline/1``).

``<baselines>/<candidate>.json`` holds thresholds per shard (``"shards": {"00": {...}}``) and/or a
``"default"``; each field is optional and a case passes when every present one holds: ``max_mean_kld``
(token-mean KLD, nats, <=), ``max_ci_high`` (upper end of the 95 % interval, <=), ``max_p99`` (<=),
``min_top1`` (top-1 agreement, >=). ``identity`` records the sha256 of the candidate's content identity
(:func:`identity_sha256`); a case whose candidate has another identity fails until the baseline is updated.
Only ``--fidelity-update-baselines`` writes them: ``max_*`` = measured x (1 + ``REL_MARGIN``) +
``ABS_MARGIN_KLD``, ``min_top1`` = measured - ``TOP1_MARGIN``; the margin absorbs numeric differences
between machines, not regressions. docs/design.md, section 2 ("Gate") and section 3; docs/configuration.md.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import VerificationError
from harness.io.atomic import atomic_write_text, dumps_json
from harness.io.jsonio import read_json

SCHEMA = "fidelity.baseline/1"

#: Relative margin added to measured maxima on update.
REL_MARGIN = 0.10
#: Absolute margin (nats) added to measured KLD maxima on update.
ABS_MARGIN_KLD = 1e-6
#: Absolute margin subtracted from measured top-1 agreement on update.
TOP1_MARGIN = 0.005

#: field -> (headline attribute, direction) where direction "max" means value <= limit.
FIELDS: dict[str, tuple[str, str]] = {
    "max_mean_kld": ("mean_kld", "max"),
    "max_ci_high": ("ci_high", "max"),
    "max_p99": ("p99", "max"),
    "min_top1": ("top1", "min"),
}


class BaselineError(VerificationError):
    """A baseline file is malformed: the message names the file, the field, the expected and the found value."""


@dataclass(frozen=True)
class Headline:
    """The headline numbers a baseline gates on, for one candidate x shard."""

    mean_kld: float
    ci_low: float
    ci_high: float
    p99: float
    top1: float


@dataclass(frozen=True)
class Violation:
    """One failed threshold: field, measured value and limit."""

    field: str
    value: float
    limit: float

    def describe(self) -> str:
        attr, direction = FIELDS[self.field]
        op = ">" if direction == "max" else "<"
        return f"{attr} {self.value:.6g} {op} {direction} {self.limit:.6g} ({self.field})"


def shard_key(shard: int) -> str:
    """The key of a shard's entry: at least two digits, ``"03"``, ``"100"`` (any shard count)."""
    return f"{shard:02d}"


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float
        return math.inf


def _valid_shard_key(key: str) -> bool:
    """A key :func:`shard_key` writes: decimal digits, at least two, no other spelling of the same shard."""
    return key.isascii() and key.isdigit() and shard_key(int(key)) == key


#: Largest KLD threshold (nats): the top edge of the report histogram. A limit above it would pass
#: a candidate whose every position is beyond anything the reports can bracket: it cannot gate.
MAX_KLD_THRESHOLD = 100.0

#: The range each threshold must lie in (outside it a gate could never fail, or never pass).
RANGES: dict[str, tuple[float, float]] = {
    "max_mean_kld": (0.0, MAX_KLD_THRESHOLD),
    "max_ci_high": (0.0, MAX_KLD_THRESHOLD),
    "max_p99": (0.0, MAX_KLD_THRESHOLD),
    "min_top1": (0.0, 1.0),
}


def _validate_entry(path: Path, where: str, entry: Any) -> dict[str, float]:
    if not isinstance(entry, dict):
        raise BaselineError(path, where, "an object of thresholds", type(entry).__name__)
    out: dict[str, float] = {}
    for key, value in entry.items():
        if key not in FIELDS:
            close = difflib.get_close_matches(key, list(FIELDS), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(FIELDS)}"
            raise BaselineError(path, f"{where}.{key}", "a known threshold field", f"unknown field {key!r}", hint)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(_as_float(value)):
            raise BaselineError(path, f"{where}.{key}", "a finite number", repr(value))
        lo, hi = RANGES[key]
        if not lo <= float(value) <= hi:
            want = f"a number in [{lo:g}, {hi:g}]"
            raise BaselineError(path, f"{where}.{key}", want, repr(value), "a threshold outside it can never fail or never pass")
        out[key] = float(value)
    return out


def identity_sha256(identity: Mapping[str, Any]) -> str:
    """sha256 of a model's content identity (canonical JSON, the informative ``name`` left out)."""
    import hashlib
    import json

    content = {k: v for k, v in identity.items() if k != "name"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def _validate_identity(path: Path, raw: Any) -> dict[str, str] | None:
    if raw is None:
        return None
    if not (isinstance(raw, dict) and set(raw) <= {"sha256", "model"} and isinstance(raw.get("sha256"), str)
            and len(raw["sha256"]) == 64 and all(c in "0123456789abcdef" for c in raw["sha256"])
            and isinstance(raw.get("model", ""), str)):
        raise BaselineError(path, "identity", "{sha256: 64 hex digits, model: the model's name}", repr(raw))
    return dict(raw)


@dataclass
class Baseline:
    """Thresholds of one candidate: a default entry and per-shard entries, and the identity of what they
    were measured on (None in a file written before identities were recorded)."""

    path: Path
    candidate: str
    default: dict[str, float]
    shards: dict[str, dict[str, float]]
    identity: dict[str, str] | None = None

    def identity_problem(self, identity: Mapping[str, Any]) -> str | None:
        """Why these thresholds do not apply to a candidate of ``identity``, or None when they do."""
        found = identity_sha256(identity)
        if self.identity is None:  # written before identities were recorded: named by the run, not failed
            return None
        if self.identity["sha256"] != found:
            return (f"{self.path}: identity: expected {self.identity['sha256'][:12]} "
                    f"({self.identity.get('model', '?')}), found {found[:12]} ({identity.get('name', '?')}): "
                    "the candidate is another model than the one the baseline was measured on")
        return None

    @classmethod
    def load(cls, path: Path, candidate: str) -> Baseline:
        """Read and validate ``path``; refuses unknown fields, wrong schema or candidate."""
        try:
            raw = read_json(path)
        except VerificationError as e:  # one error type for a bad baseline, whatever broke
            raise BaselineError(e.path, e.what, e.expected, e.found, e.hint) from None
        return cls.from_json(raw, path, candidate)

    @classmethod
    def from_json(cls, raw: Any, path: Path, candidate: str) -> Baseline:
        """Validate a parsed baseline document (``path`` names it in errors)."""
        if not isinstance(raw, dict):
            raise BaselineError(path, "top level", "an object", type(raw).__name__)
        allowed = {"schema", "candidate", "default", "shards", "margin", "identity"}
        for key in raw:
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(sorted(allowed))}"
                raise BaselineError(path, "top-level field", "a known field", repr(key), hint)
        if raw.get("schema") != SCHEMA:
            raise BaselineError(path, "schema", repr(SCHEMA), repr(raw.get("schema")))
        if raw.get("candidate") != candidate:
            raise BaselineError(path, "candidate", repr(candidate), repr(raw.get("candidate")))
        default = _validate_entry(path, "default", raw.get("default", {}))
        shards_raw = raw.get("shards", {})
        if not isinstance(shards_raw, dict):
            raise BaselineError(path, "shards", "an object keyed by shard number ('03', '100')", type(shards_raw).__name__)
        shards: dict[str, dict[str, float]] = {}
        for key, entry in shards_raw.items():
            if not _valid_shard_key(key):
                raise BaselineError(path, "shard key", "a shard number of at least two digits, like '03' or '100'", repr(key))
            shards[key] = _validate_entry(path, f"shards.{key}", entry)
        return cls(path=path, candidate=candidate, default=default, shards=shards,
                   identity=_validate_identity(path, raw.get("identity")))

    def to_json(self) -> dict[str, Any]:
        """The validated thresholds as a baseline document (recorded in published sets)."""
        doc = {"schema": SCHEMA, "candidate": self.candidate, "default": dict(self.default), "shards": dict(sorted(self.shards.items()))}
        if self.identity is not None:
            doc["identity"] = dict(self.identity)
        return doc

    def thresholds(self, shard: int) -> dict[str, float]:
        """The thresholds that apply to ``shard``: its own entry over the default."""
        return {**self.default, **self.shards.get(shard_key(shard), {})}

    def check(self, shard: int, headline: Headline) -> list[Violation]:
        """Every threshold the headline breaks (empty when it passes)."""
        out = []
        for name, limit in sorted(self.thresholds(shard).items()):
            attr, direction = FIELDS[name]
            value = float(getattr(headline, attr))
            bad = value > limit if direction == "max" else value < limit
            if bad:
                out.append(Violation(name, value, limit))
        return out


def baseline_path(directory: Path, candidate: str) -> Path:
    """Where the baseline of ``candidate`` lives."""
    return directory / f"{candidate}.json"


def thresholds_from(headline: Headline) -> dict[str, float]:
    """Thresholds written by an update: measured values plus the documented margin."""
    grow = 1.0 + REL_MARGIN
    out = {
        "max_mean_kld": float(f"{headline.mean_kld * grow + ABS_MARGIN_KLD:.6g}"),
        "max_ci_high": float(f"{headline.ci_high * grow + ABS_MARGIN_KLD:.6g}"),
        "max_p99": float(f"{headline.p99 * grow + ABS_MARGIN_KLD:.6g}"),
        "min_top1": float(f"{max(0.0, headline.top1 - TOP1_MARGIN):.6g}"),
    }
    if not math.isfinite(headline.ci_high):  # interval not estimable (too few clusters): no max_ci_high to record
        del out["max_ci_high"]
    return out


def write_baseline(directory: Path, candidate: str, measured: dict[int, Headline],
                   identity: Mapping[str, Any] | None = None) -> Path:
    """Write (or merge into) the candidate's baseline file with per-shard entries; atomic. ``identity``: the
    content identity of the candidate measured (recorded; the entries of an earlier baseline of another
    identity are not kept: they were measured on another model)."""
    path = baseline_path(directory, candidate)
    shards: dict[str, dict[str, float]] = {}
    default: dict[str, float] = {}
    ident = None if identity is None else {"sha256": identity_sha256(identity), "model": str(identity.get("name", ""))}
    if path.exists():
        old = Baseline.load(path, candidate)
        if ident is None or (old.identity is not None and old.identity["sha256"] == ident["sha256"]):
            shards, default = dict(old.shards), dict(old.default)
    for shard, head in measured.items():
        shards[shard_key(shard)] = thresholds_from(head)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "candidate": candidate,
        "margin": {"relative": REL_MARGIN, "absolute_kld": ABS_MARGIN_KLD, "top1": TOP1_MARGIN},
        "default": default,
        "shards": dict(sorted(shards.items())),
    }
    if ident is not None:
        doc["identity"] = ident
    atomic_write_text(path, dumps_json(doc))
    return path


def load_baseline_or_none(directory: Path, candidate: str) -> Baseline | None:
    """The candidate's baseline, or None when it has none or it does not load (callers that only
    *consult* a baseline -- tails, adaptive -- leave the refusal to the gate, which names the error)."""
    path = baseline_path(Path(directory), candidate)
    if not path.is_file():
        return None
    try:
        return Baseline.load(path, candidate)
    except BaselineError:
        return None


def unused_baselines(directory: Path, candidates: Iterable[str]) -> list[Path]:
    """Baseline files whose candidate is not in the configuration."""
    if not directory.is_dir():
        return []
    names = set(candidates)
    return sorted(p for p in directory.glob("*.json") if p.stem not in names)


def headline_of(metrics: Mapping[str, Any]) -> Headline:
    """The numbers baselines gate on, taken from a metrics dict."""
    kld = metrics["kld"]
    return Headline(
        mean_kld=float(kld["mean"]),
        ci_low=float(kld["ci95"][0]) if kld["ci95"] else 0.0,
        ci_high=float(kld["ci95"][1]) if kld["ci95"] else math.inf,  # not estimable: no upper bound can be certified
        p99=float(kld["p99"]),
        top1=float(metrics["top1"]["agreement"]),
    )
