"""A rerun says what it reused (harness/run/reuse.py): the capture cache's contexts, per candidate."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.run.reuse import ReuseLog


def test_the_log_counts_each_unit_once_and_merges() -> None:
    log = ReuseLog()
    log.note("captures", "a", reused={0, 1}, computed={2, 3})
    log.note("captures", "a", reused={0, 1}, computed=())  # the same contexts noted again
    log.note("captures", "b", reused={0, 1, 2, 3}, computed=())
    assert log.lines() == ["capture cache: reused 6 of 8 contexts (a 2 of 4, b 4 of 4)"]
    other = ReuseLog()
    other.merge(log.to_json())
    other.merge(log.to_json())  # a worker's whole log arrives with each of its cases
    other.note("scores", "a", reused={5}, computed={6})  # another cache, under its own name
    assert other.lines() == ["capture cache: reused 6 of 8 contexts (a 2 of 4, b 4 of 4)",
                             "score cache: reused 1 of 2 shards (a 1 of 2)"]


def test_a_rerun_of_the_ladder_says_it_reused_the_captures(fidelity_project: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    threads = torch.get_num_threads()
    root = tmp_path / "p"
    shutil.copytree(fidelity_project, root)
    args = ["ladder", "--config", str(root / "fidelity.toml"), "--shards", "0-1", "--out", str(root / "r")]
    try:
        main(args)
        first = capsys.readouterr().out
        main([*args, "--quiet"])
        second = capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)
    # shards 0-1 of the tiny suite: 4 contexts per candidate, captured by the first run, read back by the second
    assert "capture cache: reused 0 of 8 contexts (bad 0 of 4, good 0 of 4)" in first
    assert "capture cache: reused 8 of 8 contexts (bad 4 of 4, good 4 of 4)" in second
    assert "fidelity: threads " in first and "(override: FIDELITY_THREADS=N)" in first
    assert "fidelity: threads " not in second and "shard 00: mean KLD" not in second  # --quiet: no progress
    assert (root / "r" / "ladder.md").is_file()
