"""Per-worker torch thread counts (harness/scoring/threads.py)."""

from __future__ import annotations

import pytest
import torch

from harness.scoring.threads import (
    apply_worker_threads,
    available_cores,
    threads_per_worker,
)


def test_split() -> None:
    assert threads_per_worker(1, 2) == 2
    assert threads_per_worker(2, 2) == 1
    assert threads_per_worker(3, 2) == 1
    assert threads_per_worker(4, 16) == 4
    assert threads_per_worker(1) == available_cores()
    with pytest.raises(ValueError, match="workers"):
        threads_per_worker(0, 2)


def test_apply_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("FIDELITY_THREADS", raising=False)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert apply_worker_threads(available_cores()) == 1 == torch.get_num_threads()
        monkeypatch.setenv("FIDELITY_THREADS", "3")
        assert apply_worker_threads(8) == 3 == torch.get_num_threads()
        monkeypatch.setenv("FIDELITY_THREADS", "zero")
        with pytest.raises(ValueError, match="FIDELITY_THREADS"):
            apply_worker_threads(1)
    finally:
        torch.set_num_threads(before)
