"""A ladder on a Ray cluster: one task per candidate x shard, the driver writes every report (docs/ray.md).

:mod:`~harness.run.cluster.ray_executor` submits and collects the tasks (the only module that imports Ray);
:mod:`~harness.run.cluster.task` is the body a worker runs; :mod:`~harness.run.cluster.resources` what a
task asks for; :mod:`~harness.run.cluster.positions_wire` the scored positions' bytes on the way back.
"""
