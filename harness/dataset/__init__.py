"""A relocatable reference dataset: suite, shard views, reference store (chosen shards), shared
head, corpus texts with provenance, candidates' shard reports, protocol and dataset card.

Reasoning: docs/reports.md §"The dataset folder".
"""
