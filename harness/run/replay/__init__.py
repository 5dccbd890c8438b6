"""``fidelity replay``: a candidate scored against stored captures, outside pytest.

:mod:`~harness.run.replay.stores` replays capture stores (the path every replay ends in);
:mod:`~harness.run.replay.dataset` replays against a project dataset (``dataset.json``);
:mod:`~harness.run.replay.interchange` against a dataset in the interchange layout (docs/interchange.md).
"""
