"""``fidelity bench`` and harness.scoring.bench on a tiny CPU shape (the projection arithmetic, the output)."""

from __future__ import annotations

import json

import pytest

from harness.cli.main import main
from harness.scoring.bench import SEED_POSITIONS, BenchResult, flops_per_position


def test_projection_scales_by_flops() -> None:
    r = BenchResult(positions=1000, hidden=512, vocab=16_384, device="cpu", backend="torch", threads=1, tile_rows=16, reps=1,
                    t_score=[2.0])
    assert r.positions_per_s == 500.0
    ratio = flops_per_position(5120, 248_320) / flops_per_position(512, 16_384)
    assert r.projection_s() == pytest.approx(SEED_POSITIONS / 500.0 * ratio)
    assert flops_per_position(5120, 248_320) == 4 * 5120 * 248_320


@pytest.mark.slow
def test_bench_command_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--positions", "64", "--hidden", "64", "--vocab", "512", "--reps", "1", "--threads", "1", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    for key in ("scorer / bare fp32-output GEMMs", "scorer / bare bf16 GEMMs", "two-pass / scorer", "metric pass share", "positions/s",
                "peak extra memory", "projection: seed suite, 10,480,640 positions"):
        assert key in out, key
    d = json.loads(out.strip().splitlines()[-1])
    assert d["positions"] == 64 and len(d["memory"]) == 2 and d["memory"][1]["n"] == 256
    assert d["backend"] == "torch" and d["max_two_pass_diff"] < 1e-4


def test_bench_refuses_cuda_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code = main(["bench", "--device", "cuda", "--positions", "8", "--hidden", "8", "--vocab", "16"])
    assert code == 2 and "CUDA is not available" in capsys.readouterr().err
