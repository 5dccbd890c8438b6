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


class EntropySpec(TypedDict):
    """Edges of the fixed reference-entropy histogram: ``lo`` … ``hi`` nats, ``bins_per_decade``,
    ``n_counts`` = bins + underflow ``[0, lo)`` + overflow ``[hi, inf)``."""

    kind: str
    lo: float
    hi: float
    bins_per_decade: int
    n_counts: int


class ConfidenceBins(TypedDict):
    """Positions by the reference's top probability, in fixed buckets ``edges[i] <= p < edges[i+1]``
    (the last closed at 1): counts, KLD sums and top-1 agreement counts per bucket (all additive)."""

    edges: list[float]
    counts: list[int]
    sum_kld: list[float]
    top1_count: list[int]


class EntropyBins(TypedDict):
    """Positions by the reference entropy in the fixed fine bins of ``spec``: counts and KLD sums (additive)."""

    spec: EntropySpec
    counts: list[int]
    sum_kld: list[float]


class DiagnosticTotals(TypedDict):
    """Additive diagnostic sums (harness.metrics.diagnostics): sums over positions, the overlap
    counts summed, and the two bucket tables; two disjoint sets merge exactly."""

    sum_kld_rev: float  # sum of KL(q||p), nats
    sum_entropy_ref: float  # sum of H(p), nats
    sum_p_ref_top: float  # sum of p(argmax p)
    sum_q_ref_top: float  # sum of q(argmax p)
    top5_shared: int  # sum over positions of |top5(p) ∩ top5(q)|
    top10_shared: int  # sum over positions of |top10(p) ∩ top10(q)|
    by_confidence: ConfidenceBins
    by_entropy: EntropyBins


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
    #: reports written before the diagnostics existed lack the key
    diagnostics: NotRequired[DiagnosticTotals]


class TotalsMeans(TypedDict):
    """Means recomputed from :class:`Totals` (the gate's headline is :class:`harness.gate.baselines.Headline`)."""

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
    #: diagnostics per context (absent from reports written before they existed)
    sum_kld_rev: NotRequired[float]
    top5_shared: NotRequired[int]
    top10_shared: NotRequired[int]


class StratumRow(TypedDict):
    """Counts and means of one stratum."""

    contexts: int
    positions: int
    sum_kld: float
    top1_count: int
    mean_kld: float
    top1: float


class SideLevels(TypedDict):
    """How one mean's interval was read (:class:`harness.metrics.bootstrap.SideReading`)."""

    lower: float  # tail probability the lower end was read at (0: not read)
    upper: float  # tail probability the upper end was read at
    lower_at_floor: bool  # read at the floor (a / 100, or the memory floor)
    upper_at_floor: bool
    dominated: bool  # one cluster holds more than half the statistic's total: level not guaranteed
    top_share: float  # the largest cluster's share of the statistic's total


class BootstrapInfo(TypedDict):
    """How the intervals were drawn."""

    method: str  # "studentized" for means (harness.metrics.bootstrap.MEAN_METHOD)
    method_text: str  # the means' interval method in words (with the dominance warning where it fired on the KLD)
    levels: NotRequired[dict[str, SideLevels]]  # per mean statistic: how its interval was read (absent: older reports)
    level_guaranteed: NotRequired[bool]  # False: the dominance diagnostic fired on the KLD (level not guaranteed)
    tail_method: str  # the tails' (p99, CVaR1%) interval method in words
    level: float
    min_clusters: int  # fewer source clusters: every interval is None (not estimable)
    estimable: bool
    tail_min_clusters: int  # fewer source clusters: the tails' intervals (p99, CVaR1%) are None (not estimable)
    tail_estimable: bool
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


class BucketRow(TypedDict):
    """One reference-confidence bucket ``[lo, hi)``: positions, mean KLD and top-1 agreement in it."""

    lo: float
    hi: float
    positions: int
    mean_kld: float
    top1: float


class DecileRow(TypedDict):
    """One reference-entropy decile (1 = lowest entropy), a run of whole fixed bins ``[lo, hi)`` nats
    (``hi`` None: open-ended); ``positions`` is its actual count (about a tenth, never a split bin)."""

    decile: int
    lo: float
    hi: float | None
    positions: int
    mean_kld: float


class SameTop(TypedDict):
    """llama-perplexity's "Same top p": the top-1 agreement with its i.i.d. binomial standard error."""

    fraction: float
    se_iid: float | None  # None with a single position


class Diagnostics(TypedDict):
    """The diagnostic block of a shard report or aggregate (harness.metrics.diagnostics)."""

    kld_rev: MeanCI  # mean KL(q||p), nats
    entropy_ref_mean: float  # mean H(p), nats
    p_ref_top_mean: float  # mean reference confidence p(argmax p)
    q_ref_top_mean: float  # mean candidate probability of the reference's top token
    top5_overlap: MeanCI  # mean |top5(p) ∩ top5(q)| / 5
    top10_overlap: MeanCI  # mean |top10(p) ∩ top10(q)| / 10
    same_top: SameTop
    by_confidence: list[BucketRow]  # non-empty buckets only
    by_entropy_decile: list[DecileRow]


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
    #: reverse KL, entropy, top-k overlap, KLD by confidence and entropy (reports written before it lack the key)
    diagnostics: NotRequired[Diagnostics]


__all__ = [
    "BootstrapInfo",
    "SideLevels",
    "BucketRow",
    "ConfidenceBins",
    "DecileRow",
    "DiagnosticTotals",
    "Diagnostics",
    "EntropyBins",
    "EntropySpec",
    "SameTop",
    "ContextRow",
    "DeltaP",
    "TotalsMeans",
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
