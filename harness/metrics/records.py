"""The JSON shape of a report's statistics, as TypedDicts (docs/design.md, sections 2-3).

These describe the ``metrics`` block that :func:`harness.metrics.summary.summarize` writes and every
reader (aggregate, publish, gate, tails, windows, paired) reads by key; they add no field and change
nothing on disk. Field meanings are in :mod:`harness.metrics.summary`. Intervals are ``[lo, hi]``.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class HistogramSpec(TypedDict):
    """Edges of the fixed log-spaced histogram: ``lo`` … ``hi`` nats, ``bins_per_decade``, and
    ``n_counts`` = bins + underflow + overflow."""

    kind: str
    lo: float
    hi: float
    bins_per_decade: int
    n_counts: int
    layout: str


class HistogramJSON(TypedDict):
    """A histogram as stored: its spec and one count per bin (underflow first, overflow last)."""

    spec: HistogramSpec
    counts: list[int]


class Totals(TypedDict):
    """Additive sums of one position set; two disjoint sets merge exactly (``merge_totals``)."""

    n_positions: int
    sum_kld: float
    sum_jsd_bits: float
    sum_ear: float
    top1_count: int
    sum_nll_ref: float
    sum_nll_cand: float
    sum_delta_p: float
    sum_delta_p_sq: float
    max_kld: float
    exceedance: dict[str, int]
    histogram: HistogramJSON


class Headline(TypedDict):
    """Means recomputed from :class:`Totals`."""

    kld_mean: float
    top1: float
    ear_mean: float
    jsd_bits_mean: float
    ppl_ref: float
    ppl_cand: float


class ContextRow(TypedDict):
    """One context of a report: enough to recompute the headline from the report alone."""

    index: int
    cluster: int | str
    stratum: str
    positions: int
    sum_kld: float
    mean_kld: float
    max_kld: float
    top1: int
    sum_jsd_bits: float
    sum_ear: float
    sum_nll_ref: float
    sum_nll_cand: float


class StratumRow(TypedDict):
    """Counts and means of one stratum."""

    contexts: int
    positions: int
    sum_kld: float
    top1_count: int
    mean_kld: float
    top1: float


class BootstrapInfo(TypedDict):
    """How the intervals were drawn."""

    method: str  # "studentized" for means (harness.metrics.bootstrap.MEAN_METHOD)
    method_text: str  # the means' interval method in words
    tail_method: str  # the tails' (p99, CVaR1%) interval method in words
    level: float
    min_clusters: int  # fewer source clusters: every interval is None (not estimable)
    estimable: bool
    n_boot: int
    n_boot_tails: int
    seed: int


class KldStats(TypedDict):
    """The KLD block: the headline mean, its interval, quantiles and tails."""

    mean: float
    mean_context_macro: float
    ci95: list[float] | None  # None: not estimable (too few source clusters)
    se_iid: float
    median: float
    p95: float
    p99: float
    p999: float
    cvar1: float
    max: float
    p99_ci95: list[float] | None  # None: not estimable (too few source clusters)
    cvar1_ci95: list[float] | None  # None: not estimable (too few source clusters)


class TopOne(TypedDict):
    """Top-1 agreement: fraction, count and interval."""

    agreement: float
    count: int
    ci95: list[float] | None  # None: not estimable (too few source clusters)


class MeanCI(TypedDict):
    """A mean and its cluster-bootstrap interval (EAR, JSD)."""

    mean: float
    ci95: list[float] | None  # None: not estimable (too few source clusters)


class Perplexity(TypedDict):
    """Perplexities of both models on the true next tokens."""

    ref: float
    cand: float
    ratio: float
    mean_ln_ratio: float
    corr_nll: float | None


class DeltaP(TypedDict):
    """Δp = q(y) − p(y) statistics."""

    mean: float
    std: float
    rms: float
    min: float
    max: float
    percentiles: dict[str, float]


class ShardSummary(TypedDict):
    """The ``metrics`` block of a shard report (what ``summarize`` returns)."""

    n_positions: int
    n_contexts: int
    n_clusters: int
    score_from: int
    bootstrap: BootstrapInfo
    kld: KldStats
    exceedance: dict[str, int]
    histogram: HistogramJSON
    top1: TopOne
    ear: MeanCI
    jsd_bits: MeanCI
    ppl: Perplexity
    delta_p: DeltaP
    per_stratum: dict[str, StratumRow]
    worst_contexts: list[ContextRow]
    contexts: list[ContextRow]
    totals: Totals
    #: the smallest difference in mean KLD this run resolves (harness.planning.design); reports written
    #: before it existed lack the key, and None when the run has too few clusters
    resolvable_delta: NotRequired[float | None]


__all__ = [
    "BootstrapInfo",
    "ContextRow",
    "DeltaP",
    "Headline",
    "HistogramJSON",
    "HistogramSpec",
    "KldStats",
    "MeanCI",
    "Perplexity",
    "ShardSummary",
    "StratumRow",
    "Totals",
    "TopOne",
]
