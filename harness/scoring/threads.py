"""Torch thread counts that fit the machine: its free cores, split between pytest-xdist workers.

Reasoning: docs/performance.md §"Thread counts".
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from harness.errors import UsageError

__all__ = ["ThreadChoice", "apply_default_threads", "apply_worker_threads", "available_cores", "choose_threads",
           "free_cores", "machine_load", "runnable_now", "threads_per_worker"]

#: Set beside ``OMP_NUM_THREADS`` when the harness itself wrote it (for a torch not imported yet), so neither this
#: process nor the pytest-xdist workers it starts take the harness's own count for a user's override.
_SET_BY_HARNESS = "FIDELITY_OMP_NUM_THREADS_SET"
#: How a user changes the count, as the session header says it.
OVERRIDE = "FIDELITY_THREADS=N"


@dataclass(frozen=True)
class ThreadChoice:
    """The torch thread count chosen for this process, and why."""

    #: Torch threads.
    n: int
    #: CPUs this process may run on.
    cores: int
    #: Why ``n``: the override that set it, or the load the free cores were counted from (:func:`machine_load`).
    why: str

    def line(self) -> str:
        """E.g. ``threads 1 of 2: load average 7.5, 6 other tasks runnable now (override: FIDELITY_THREADS=N)``."""
        return f"threads {self.n} of {self.cores}: {self.why} (override: {OVERRIDE})"


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


#: Reads of ``/proc/stat`` by :func:`runnable_now`, and the seconds between them.
RUNNABLE_SAMPLES = 3
RUNNABLE_INTERVAL_S = 0.005


def runnable_now(samples: int = RUNNABLE_SAMPLES, interval_s: float = RUNNABLE_INTERVAL_S) -> int | None:
    """Tasks runnable on this machine now besides the reader: the most of ``samples`` reads of ``procs_running`` in
    ``/proc/stat`` (Linux), ``interval_s`` apart, minus 1 (this process); None where the OS has no such count."""
    most = -1
    for i in range(samples):
        try:
            with open("/proc/stat", "rb") as f:
                for line in f:
                    if line.startswith(b"procs_running "):
                        most = max(most, int(line.split()[1]))
                        break
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < samples:
            time.sleep(interval_s)
    return None if most < 0 else max(most - 1, 0)


def machine_load() -> tuple[float | None, int | None, float]:
    """``(one-minute load average, tasks runnable now, load)``: the load counted against the cores is the smaller of
    the two (either alone where the OS has only one; 0 where it has neither). The average lags (it decays as
    ``exp(-t / 60 s)``): a job that ended seconds ago still counts almost a core per thread it ran, so a run started
    right after another would leave cores idle; the count of tasks runnable now (read only where the average says a
    core is busy) does not."""
    try:
        avg: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        avg = None
    now = runnable_now() if avg is None or round(avg) >= 1 else None
    known = [x for x in (avg, now) if x is not None]
    return avg, now, float(min(known)) if known else 0.0


def free_cores(cores: int | None = None, load: float | None = None) -> int:
    """Cores not busy with other work: ``cores - round(load)`` clamped to ``[1, cores]``.

    ``load`` defaults to :func:`machine_load`'s (where the OS has neither count, every core counts as free)."""
    n = cores if cores is not None else available_cores()
    if load is None:
        load = machine_load()[2]
    return max(1, min(n, n - int(round(load))))


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Torch threads for each of ``workers`` processes sharing ``cores`` CPUs (default: the free cores; at least 1)."""
    if workers < 1:
        raise ValueError(f"workers: expected >= 1, found {workers}")
    return max(1, (cores if cores is not None else free_cores()) // workers)


def _override_named() -> tuple[str, str] | None:
    """``(variable, text)`` of the user's override: FIDELITY_THREADS, else an OMP_NUM_THREADS the harness did not write."""
    if os.environ.get("FIDELITY_THREADS"):
        return "FIDELITY_THREADS", os.environ["FIDELITY_THREADS"]
    omp = os.environ.get("OMP_NUM_THREADS")
    if omp and omp != os.environ.get(_SET_BY_HARNESS):
        return "OMP_NUM_THREADS", omp
    return None


def _override() -> int | None:
    """``FIDELITY_THREADS`` or ``OMP_NUM_THREADS`` as a positive integer; None when neither is set."""
    named = _override_named()
    if named is None:
        return None
    override = named[1]
    try:
        n = int(override)
    except ValueError:
        raise UsageError(f"FIDELITY_THREADS/OMP_NUM_THREADS: expected a positive integer, found {override!r}") from None
    if n < 1:
        raise UsageError(f"FIDELITY_THREADS/OMP_NUM_THREADS: expected a positive integer, found {override!r}")
    return n


def choose_threads(workers: int = 1) -> ThreadChoice:
    """The count for one of ``workers`` processes on this machine and why: the override, else the free cores."""
    cores = available_cores()
    n = _override()
    if n is not None:
        name, text = _override_named() or ("", "")
        return ThreadChoice(n, cores, f"{name}={text}")
    avg, now, load = machine_load()
    free = free_cores(cores, load)
    n = threads_per_worker(workers, free)
    if avg is None:
        why = "no load average on this OS: every core" if now is None else f"{now} other tasks runnable now"
    else:
        why = f"load average {avg:.1f}" + ("" if now is None else f", {now} other tasks runnable now")
    if workers > 1:
        why += f", {free} free core{'s' * (free != 1)} shared by {workers} workers"
    return ThreadChoice(n, cores, why)


def apply_default_threads() -> int:
    """Set this process's torch thread count to the override, else the free cores; returns the count set.

    Where torch is not imported yet (the ``fidelity`` command, whose subcommands import it only when
    they compute), the count goes to ``OMP_NUM_THREADS``, which torch reads when it starts: no
    import cost for the commands that never need torch."""
    return apply_threads(choose_threads()).n


def apply_threads(choice: ThreadChoice) -> ThreadChoice:
    """Give torch ``choice.n`` threads (through ``OMP_NUM_THREADS`` where torch is not imported yet); returns it."""
    import sys

    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(choice.n)
    elif (named := _override_named()) is None or named[0] != "OMP_NUM_THREADS":  # a user's OMP_NUM_THREADS stays
        os.environ["OMP_NUM_THREADS"] = os.environ[_SET_BY_HARNESS] = str(choice.n)
    return choice


def apply_worker_threads(workers: int) -> int:
    """Set this process's torch thread count for ``workers`` workers; returns the count set."""
    import torch

    n = choose_threads(workers).n
    torch.set_num_threads(n)
    return n
