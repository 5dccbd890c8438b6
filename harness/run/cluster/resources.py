"""What one candidate x shard task asks a cluster for: CPUs and GPUs, from the candidate's engine.

Reasoning: docs/ray.md §"How a task's resources are chosen".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from harness.errors import FidelityError

__all__ = ["TaskResources", "task_resources"]


@dataclass(frozen=True)
class TaskResources:
    """A task's resource request, in the units a Ray ``.options(...)`` call takes."""

    #: CPU slots (Ray sets the task's ``OMP_NUM_THREADS`` to this).
    num_cpus: float
    #: Whole GPUs (0 on a CPU run).
    num_gpus: float

    def as_options(self) -> dict[str, float]:
        """``{"num_cpus": ..., "num_gpus": ...}`` for ``remote_function.options(**...)``."""
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}


def _option(options: object, key: str) -> object:
    """``options[key]`` (a mapping) or ``options.key`` (a dataclass), None when absent."""
    if options is None:
        return None
    if isinstance(options, Mapping):
        return options.get(key)
    return getattr(options, key, None)


def _count(value: object, key: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FidelityError(f"candidate {name}: options.{key}: expected an integer >= 1, found {value!r}")
    return value


def task_resources(engine: str | None, options: object, name: str, *, gpu: bool) -> TaskResources:
    """The request of one task of candidate ``name``: ``engine`` is None for a replayed store,
    ``options`` the candidate's engine options (a mapping or dataclass; None: defaults), ``gpu``
    whether the run scores on GPUs (``--fidelity-device cuda``, or ``auto`` on a cluster that has them)."""
    threads = _option(options, "threads")
    cpus = _count(threads, "threads", name) if threads is not None else 1
    max_memory = _option(options, "max_memory")
    if engine == "transformers" and isinstance(max_memory, Mapping):
        # device_map = "auto" over the GPUs max_memory names (integer keys; "cpu" / "disk" are not GPUs)
        gpus = sum(1 for k in max_memory if str(k).isdigit())
        return TaskResources(num_cpus=cpus, num_gpus=max(gpus, 1) if gpu else 0)
    if engine == "vllm":
        tp = _option(options, "tensor_parallel_size")
        gpus = _count(tp, "tensor_parallel_size", name) if tp is not None else 1
        return TaskResources(num_cpus=cpus, num_gpus=gpus if gpu else 0)
    return TaskResources(num_cpus=cpus, num_gpus=1 if gpu else 0)
