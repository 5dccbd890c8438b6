"""Per-worker torch thread counts (harness/scoring/threads.py)."""

from __future__ import annotations

import pytest

from harness.scoring.threads import (
    available_cores,
    free_cores,
    threads_per_worker,
)


def test_split() -> None:
    assert threads_per_worker(1, 2) == 2
    assert threads_per_worker(2, 2) == 1
    assert threads_per_worker(3, 2) == 1
    assert threads_per_worker(4, 16) == 4
    assert 1 <= threads_per_worker(1) <= available_cores()
    with pytest.raises(ValueError, match="workers"):
        threads_per_worker(0, 2)


def _in_fresh_process(body: str) -> None:
    """Run ``body`` in a new interpreter: a process's torch thread count is process-wide state that earlier
    tests (and the libraries they load) change, so the counts are checked where nothing else ran first."""
    import os
    import subprocess
    import sys
    import textwrap

    env = {k: v for k, v in os.environ.items() if k not in ("FIDELITY_THREADS", "OMP_NUM_THREADS")}
    code = "import os, torch\nfrom harness.scoring import threads as threads_mod\n" + textwrap.dedent(body) + "\nprint('ok')\n"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr


def test_apply_and_override() -> None:
    _in_fresh_process("""
        from harness.scoring.threads import apply_worker_threads, available_cores
        threads_mod.machine_load = lambda: (15.0, 15, 15.0)  # a machine with one free core
        assert apply_worker_threads(available_cores()) == 1 == torch.get_num_threads()
        threads_mod.available_cores = lambda: 16  # an idle 16-core machine
        threads_mod.machine_load = lambda: (0.0, None, 0.0)
        assert apply_worker_threads(4) == 4 == torch.get_num_threads()
        os.environ["FIDELITY_THREADS"] = "3"
        assert apply_worker_threads(8) == 3 == torch.get_num_threads()
        os.environ["FIDELITY_THREADS"] = "zero"
        try:
            apply_worker_threads(1)
        except ValueError as exc:
            assert "FIDELITY_THREADS" in str(exc)
        else:
            raise AssertionError("FIDELITY_THREADS=zero was accepted")
    """)


def test_free_cores_subtract_the_load() -> None:
    assert free_cores(2, 0.2) == 2  # idle: every core, as torch's own default
    assert free_cores(2, 0.6) == 1
    assert free_cores(2, 14.0) == 1  # overloaded: one thread, never zero
    assert free_cores(16, 3.6) == 12
    assert free_cores(4, 0.0) == 4
    assert 1 <= free_cores() <= available_cores()


def test_default_threads_follow_the_load_and_the_override() -> None:
    _in_fresh_process("""
        from harness.scoring.threads import apply_default_threads
        threads_mod.runnable_now = lambda: None  # the load average alone
        threads_mod.os.getloadavg = lambda: (9.0, 9.0, 9.0)
        threads_mod.available_cores = lambda: 4
        assert apply_default_threads() == 1 == torch.get_num_threads()  # busy 4-core machine
        threads_mod.os.getloadavg = lambda: (1.2, 1.0, 1.0)
        assert apply_default_threads() == 3 == torch.get_num_threads()
        os.environ["FIDELITY_THREADS"] = "2"
        assert apply_default_threads() == 2 == torch.get_num_threads()
    """)


def test_the_choice_says_why() -> None:
    _in_fresh_process("""
        from harness.scoring.threads import apply_default_threads, choose_threads
        threads_mod.runnable_now = lambda: None  # the load average alone
        threads_mod.os.getloadavg = lambda: (7.5, 1.0, 1.0)
        threads_mod.available_cores = lambda: 2
        assert choose_threads().line() == "threads 1 of 2: load average 7.5 (override: FIDELITY_THREADS=N)"
        threads_mod.available_cores = lambda: 16
        c = choose_threads(4)
        assert (c.n, c.why) == (2, "load average 7.5, 8 free cores shared by 4 workers"), c
        os.environ["OMP_NUM_THREADS"] = "3"  # a user's own OpenMP setting is an override
        assert choose_threads().why == "OMP_NUM_THREADS=3"
        os.environ["FIDELITY_THREADS"] = "5"
        assert choose_threads(4).line() == "threads 5 of 16: FIDELITY_THREADS=5 (override: FIDELITY_THREADS=N)"
    """)


def test_a_job_that_just_ended_leaves_its_cores_free() -> None:
    """The one-minute average still counts a job that ended seconds ago; the tasks runnable now do not: the smaller
    of the two is the load (and the count is read only where the average says a core is busy)."""
    _in_fresh_process("""
        from harness.scoring.threads import choose_threads, machine_load
        threads_mod.available_cores = lambda: 2
        threads_mod.os.getloadavg = lambda: (1.9, 1.0, 1.0)  # a 2-core job ended a moment ago
        threads_mod.runnable_now = lambda: 0
        assert machine_load() == (1.9, 0, 0.0)
        assert choose_threads().line() == ("threads 2 of 2: load average 1.9, 0 other tasks runnable now "
                                           "(override: FIDELITY_THREADS=N)")
        threads_mod.runnable_now = lambda: 3  # busier now than the average says: the average
        assert machine_load()[2] == 1.9 and choose_threads().n == 1
        def unread():
            raise AssertionError("read on an idle machine")
        threads_mod.runnable_now = unread
        threads_mod.os.getloadavg = lambda: (0.3, 1.0, 1.0)
        assert machine_load() == (0.3, None, 0.3) and choose_threads().n == 2
    """)


def test_runnable_now_counts_a_busy_process() -> None:
    """Against a process known to be running: a child spinning on a core is counted (Linux's /proc/stat)."""
    import subprocess
    import sys
    import time

    from harness.scoring.threads import runnable_now

    before = runnable_now()
    if before is None:
        pytest.skip("no /proc/stat procs_running on this OS")
    assert before >= 0
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert max(runnable_now(samples=20, interval_s=0.01) or 0 for _ in range(5)) >= 1
    finally:
        child.kill()
        child.wait()


def test_the_harness_own_omp_setting_is_not_an_override() -> None:
    """The fidelity command and a pytest controller hand their count to a torch not yet imported through
    OMP_NUM_THREADS; a second choice (an xdist worker inherits the variable) still splits the free cores."""
    code = ("import os\nfrom harness.scoring import threads as t\n"
            "t.os.getloadavg = lambda: (0.0, 0.0, 0.0)\nt.available_cores = lambda: 8\n"
            "assert t.apply_default_threads() == 8 and os.environ['OMP_NUM_THREADS'] == '8'\n"
            "c = t.choose_threads(4)\nassert (c.n, c.why) == (2, 'load average 0.0, 8 free cores shared by 4 workers'), c\n"
            "print('ok')\n")
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("FIDELITY_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_cli_sets_threads_before_torch_starts() -> None:
    """The fidelity command hands the count to a torch it has not imported (OMP_NUM_THREADS): a command
    that never computes does not pay torch's import."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("import os, sys\nfrom harness.cli.main import main\n"
            f"rc = main(['suite', 'show', {str(root / 'fixtures' / 'suite')!r}])\n"
            "print(rc, os.environ.get('OMP_NUM_THREADS'), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["FIDELITY_THREADS"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.split()[-3:] == ["0", "1", "False"], out.stdout + out.stderr
