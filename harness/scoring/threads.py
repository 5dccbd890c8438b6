"""Torch thread counts for pytest-xdist workers: ``-n W`` workers split the cores between them.

Without this every worker runs torch with one thread per core, so ``-n 2`` on 2 cores puts four
busy threads on two cores and gains nothing (the threads wait on each other at every parallel
op). :func:`apply_worker_threads` gives each of W workers ``max(1, cores // W)`` threads, where
``cores`` is the CPUs this process may run on. ``FIDELITY_THREADS`` (a positive integer) or an
explicit ``OMP_NUM_THREADS`` wins over the split.
"""

from __future__ import annotations

import os

__all__ = ["apply_worker_threads", "available_cores", "threads_per_worker"]


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Torch threads for each of ``workers`` processes sharing ``cores`` CPUs (at least 1)."""
    if workers < 1:
        raise ValueError(f"workers: expected >= 1, found {workers}")
    return max(1, (cores if cores is not None else available_cores()) // workers)


def apply_worker_threads(workers: int) -> int:
    """Set this process's torch thread count for ``workers`` workers; returns the count set."""
    import torch

    override = os.environ.get("FIDELITY_THREADS") or os.environ.get("OMP_NUM_THREADS")
    if override:
        try:
            n = int(override)
        except ValueError:
            raise ValueError(f"FIDELITY_THREADS/OMP_NUM_THREADS: expected a positive integer, found {override!r}") from None
        if n < 1:
            raise ValueError(f"FIDELITY_THREADS/OMP_NUM_THREADS: expected a positive integer, found {override!r}")
    else:
        n = threads_per_worker(workers)
    torch.set_num_threads(n)
    return n
