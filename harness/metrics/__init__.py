"""Statistics over per-position scores (docs/design.md, section 2): one concept per module.

* :mod:`~harness.metrics.positions` — context labels, the scoring window, cluster ids
* :mod:`~harness.metrics.histogram` — the fixed log-spaced KLD histogram and exceedance counts
* :mod:`~harness.metrics.tails` — quantiles and CVaR, plain and multiplicity-weighted
* :mod:`~harness.metrics.bootstrap` — the source-cluster bootstrap
* :mod:`~harness.metrics.summary` — ``summarize``: everything a report holds
* :mod:`~harness.metrics.records` — the JSON shape of that, as TypedDicts (``ShardSummary``, ``Totals``)
* :mod:`~harness.metrics.paired` — ``paired``: two candidates on the same positions
"""

from harness.metrics.histogram import LogHistogram
from harness.metrics.paired import paired
from harness.metrics.positions import ContextLabel
from harness.metrics.summary import headline_from_totals, merge_totals, summarize, totals

__all__ = ["ContextLabel", "LogHistogram", "summarize", "paired", "totals", "merge_totals", "headline_from_totals"]
