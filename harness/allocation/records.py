"""The records of a layout search, as ``allocation.json`` holds them: the search (:class:`AllocationResult`,
written by :func:`harness.allocation.plan.allocate`), the built-and-scored check
(:class:`AllocationCheck`, :func:`harness.run.allocation_check.check_allocation`) and the file that joins them
(:class:`AllocationDoc`). Every writer and reader shares these declarations; ``harness.io.schema.schema_of``
turns them into the check of a file read back. KLD in nats, bytes as stored, intervals 95%.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from harness.attribution.effects import Estimate, TestedEstimate
from harness.reports.plot import SizePoint


class SuiteRef(TypedDict):
    """The suite the effects were measured on."""

    path: str
    suite_token_sha256: str
    #: the shards the effects were measured on
    shards: list[int]


class GroupRecord(TypedDict):
    """A tensor group: units that always get the same choice."""

    name: str
    units: list[str]


class BaseRecord(TypedDict):
    """The base layout every effect is measured against."""

    #: as given: a choice, or a candidate of the family (a folder, a ``.gguf`` file)
    spec: str
    #: ``{unit: choice}``
    layout: dict[str, str]
    bytes: int
    #: its mean KLD, in process, on the search's shards
    kld: TestedEstimate


class RankAgreement(TypedDict):
    """Spearman's ρ and Kendall's τ between the proxy and the measured effects (None: undefined)."""

    #: (group, choice) pairs compared
    n: int
    spearman: float | None
    kendall: float | None
    #: absent below three pairs
    spearman_p: NotRequired[float | None]
    kendall_p: NotRequired[float | None]


class ProxyRecord(TypedDict):
    """The per-module teacher-forced error proxy (:mod:`harness.allocation.proxy`)."""

    definition: str
    #: contexts the units' inputs were taken from
    contexts: int
    #: ``k = KLD(base) / Σ_u e(u, base_u)``: nats per unit of proxy energy
    scale_nats_per_unit: float
    rank_agreement: RankAgreement


class EffectRow(TypedDict):
    """One (group, choice): the group at ``choice``, every other group at the base, paired with the base."""

    group: str
    choice: str
    #: KLD(variant) − KLD(base)
    delta_kld: TestedEstimate
    #: the group's stored bytes at ``choice`` and at the base
    bytes: int
    base_bytes: int
    #: the group's proxy for ``choice`` relative to the base
    proxy: float


class Proposal(TypedDict):
    """The knapsack's layout for one budget, predicted and measured in process."""

    #: the budget as the search names it (bytes, ``base`` or a choice)
    budget_spec: str
    budget_bytes: int
    #: the budget in words
    budget_is: str
    #: ``{group: choice}`` (the base's own choice(s) where the group stays)
    groups: dict[str, str]
    #: ``{unit: choice}``
    layout: dict[str, str]
    predicted_bytes: int
    #: Σ_g Δ(g, L_g) and KLD(base) + Σ_g Δ(g, L_g)
    predicted_delta_kld: TestedEstimate
    predicted_kld: TestedEstimate
    #: what the knapsack minimised (summed measured effects, or the scaled proxy)
    objective: float
    #: the layout scored in process, and that minus the prediction
    in_process_kld: TestedEstimate
    interaction: TestedEstimate


class BootstrapRecord(TypedDict):
    """How the intervals were drawn."""

    method: str
    method_text: str
    level: float
    n_boot: int
    seed: int


class ComputeRecord(TypedDict):
    """Where the in-process scoring ran."""

    device: str
    dtype: str
    capture: str


class TimingRecord(TypedDict):
    """Seconds spent (never compared)."""

    effects_s: float
    proposals_s: float
    total_s: float


class AllocationResult(TypedDict):
    """The search (schema ``fidelity.allocation/1``): measured effects, the proxy, one proposal per budget."""

    schema: Literal["fidelity.allocation/1"]
    #: ``project`` or ``gguf``
    family: str
    choices: list[str]
    reference: str
    suite: SuiteRef
    n_contexts: int
    n_clusters: int
    n_positions: int
    grouping: str
    groups: list[GroupRecord]
    base: BaseRecord
    #: stored bytes no layout chooses (embedding, norms)
    fixed_bytes: int
    #: what the knapsack minimised: ``measured`` or ``proxy``
    effects_used: str
    proxy: ProxyRecord
    #: the additivity assumption in words
    additivity: str
    effects: list[EffectRow]
    proposals: list[Proposal]
    bootstrap: BootstrapRecord
    compute: ComputeRecord
    variants_scored: int
    timing: TimingRecord


class MeasuredKld(Estimate):
    """A built candidate's mean KLD over the shards it was scored on."""

    shards: list[int]


class PredictedOnBase(TypedDict):
    """The search's predicted change added to the base layout's KLD as scored by the check."""

    value: float
    #: the candidate standing for the base layout
    base: str
    base_kld: float


class SearchShardsKld(TypedDict):
    """A built proposal's mean KLD on the shards the search measured its effects on (in-sample)."""

    value: float
    shards: list[int]


class PairedDiff(TypedDict):
    """``KLD(proposal) − KLD(comparator)`` on the same positions, with the paired verdict."""

    diff: float
    ci95: list[float] | None
    verdict: str


class ComparatorPaired(PairedDiff):
    """The paired comparison with the comparator, and its equivalence margin."""

    margin: float


class HeldOut(PairedDiff):
    """The paired comparison on the shards the search did not measure its effects on."""

    shards: list[int]


class Comparator(TypedDict):
    """The layout whose bytes set the budget, and the proposal against it."""

    candidate: str
    on_disk_bytes: int
    measured_kld: Estimate
    #: the proposal's on-disk bytes over the comparator's
    size_ratio: float
    paired: ComparatorPaired
    #: only when some but not all of the selected shards were unseen by the search
    paired_held_out: NotRequired[HeldOut]


class CheckProposal(TypedDict):
    """One proposal, built and scored as an ordinary candidate."""

    candidate: str
    budget_spec: str
    budget_bytes: int
    predicted_bytes: int
    #: the built candidate's stored tensor bytes (equal to ``predicted_bytes``, checked)
    built_bytes: int
    on_disk_bytes: int
    #: the search's figures, repeated
    predicted_kld: TestedEstimate
    in_process_kld: TestedEstimate
    interaction: TestedEstimate
    measured_kld: MeasuredKld
    #: when the base layout is among the scored candidates
    predicted_kld_on_measured_base: NotRequired[PredictedOnBase]
    #: when the check scored some of the search's shards
    measured_kld_search_shards: NotRequired[SearchShardsKld]
    #: when a layout of the budget's size was built
    comparator: NotRequired[Comparator]


class CheckCandidate(TypedDict):
    """A built (or given) candidate as scored."""

    model: str
    on_disk_bytes: int
    mean_kld: float
    ci95: list[float] | None


class PairRow(PairedDiff):
    """A proposal against a uniform layout (or the base) at least as large."""

    proposed: str
    versus: str
    proposed_bytes: int
    versus_bytes: int


class AllocationCheck(TypedDict):
    """The proposals built and scored (schema ``fidelity.allocation-check/1``)."""

    schema: Literal["fidelity.allocation-check/1"]
    family: str
    engine: str
    shards: list[int]
    #: the configuration whose suite and reference scored them
    config: str
    candidates: dict[str, CheckCandidate]
    proposals: list[CheckProposal]
    pairs: list[PairRow]
    #: the points of ``kld-vs-size.png`` (bits per weight not written)
    plot_points: list[SizePoint]


class AllocationDoc(AllocationResult):
    """``allocation.json``: the search, and the check when the layouts were built."""

    check: NotRequired[AllocationCheck]
