"""Attribution of a candidate's drift to tensor groups (``fidelity attribute``).

* :mod:`~harness.attribution.groups` -- which parameters form a group (per layer, per module kind, globs)
* :mod:`~harness.attribution.sizes` -- the bytes each group occupies in the candidate's weight files
* :mod:`~harness.attribution.ablation` -- one model in memory, weights swapped in place, captured and scored
* :mod:`~harness.attribution.effects` -- per-group effects with paired cluster intervals, additivity, bits to spend
* :mod:`~harness.attribution.render` -- the ranked table (Markdown + JSON) and the bar plot
"""
