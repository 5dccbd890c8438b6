"""Torch thread counts that fit the machine: its free cores, split between pytest-xdist workers.

torch starts one thread per core. On a machine whose cores are already busy that is the wrong
count: every parallel op ends in a barrier where the threads wait for the slowest one, and a
thread that lost its core to another process holds everybody up (measured: a scorer workload
ran 1.3-2.4x slower with 2 threads than with 1 on 2 cores at load average ~14;
docs/performance.md, "Threads"). So the default counts only the *free* cores:
``free = cores - round(load average over the last minute)`` at start-up, at least 1, at most
``cores`` (:func:`free_cores`), and ``-n W`` workers get ``max(1, free // W)`` each. On an idle
machine that is every core, as before.

``FIDELITY_THREADS`` (a positive integer) or an explicit ``OMP_NUM_THREADS`` wins over both.
:func:`apply_default_threads` is called by the ``fidelity`` command and by the pytest plugin at
session start (the controller or the single process); :func:`apply_worker_threads` by each xdist
worker.
"""

from __future__ import annotations

import os

from harness.errors import UsageError

__all__ = ["apply_default_threads", "apply_worker_threads", "available_cores", "free_cores", "threads_per_worker"]


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def free_cores(cores: int | None = None, load: float | None = None) -> int:
    """Cores not busy with other work: ``cores - round(load)`` clamped to ``[1, cores]``.

    ``load`` defaults to the one-minute load average (``os.getloadavg``; where the OS has none,
    every core counts as free)."""
    n = cores if cores is not None else available_cores()
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    return max(1, min(n, n - int(round(load))))


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Torch threads for each of ``workers`` processes sharing ``cores`` CPUs (default: the free cores; at least 1)."""
    if workers < 1:
        raise ValueError(f"workers: expected >= 1, found {workers}")
    return max(1, (cores if cores is not None else free_cores()) // workers)


def _override() -> int | None:
    """``FIDELITY_THREADS`` or ``OMP_NUM_THREADS`` as a positive integer; None when neither is set."""
    override = os.environ.get("FIDELITY_THREADS") or os.environ.get("OMP_NUM_THREADS")
    if not override:
        return None
    try:
        n = int(override)
    except ValueError:
        raise UsageError(f"FIDELITY_THREADS/OMP_NUM_THREADS: expected a positive integer, found {override!r}") from None
    if n < 1:
        raise UsageError(f"FIDELITY_THREADS/OMP_NUM_THREADS: expected a positive integer, found {override!r}")
    return n


def apply_default_threads() -> int:
    """Set this process's torch thread count to the override, else the free cores; returns the count set.

    Where torch is not imported yet (the ``fidelity`` command, whose subcommands import it only when
    they compute), the count goes to ``OMP_NUM_THREADS``, which torch reads when it starts: no
    import cost for the commands that never need torch."""
    import sys

    n = _override() or free_cores()
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    else:
        os.environ["OMP_NUM_THREADS"] = str(n)
    return n


def apply_worker_threads(workers: int) -> int:
    """Set this process's torch thread count for ``workers`` workers; returns the count set."""
    import torch

    n = _override() or threads_per_worker(workers)
    torch.set_num_threads(n)
    return n
