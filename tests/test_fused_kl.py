"""The fused Triton kernel (harness/scoring/fused_kl.py) on a CPU, under Triton's interpreter.

One child process (``tests/fused_kl_cases.py``, ``TRITON_INTERPRET=1`` set only there) scores
small cases -- N=37, H=64, V=1000 (V not a multiple of the column block), ties across column
blocks, identical operands, peaked and flat logits, H not a multiple of BLOCK_K, a candidate's
own head, a pathological logit range that needs the torch fallback -- and these tests compare
its outputs with a float64 numpy reference and with the torch path. Skipped, with the reason,
when triton is not installed (``pip install --no-deps 'triton==3.8.0'``; see docs/performance.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.scoring.backends import triton_available

pytestmark = [
    pytest.mark.skipif(
        not triton_available(),
        reason="triton is not installed (optional: pip install --no-deps 'triton==3.8.0'); the fused kernel is untested here",
    ),
    pytest.mark.slow,  # the Triton kernel under the CPU interpreter (a subprocess, minutes on 2 cores)
    pytest.mark.xdist_group("fused_kl"),  # `-n 2 --dist loadgroup`: one worker runs the module's subprocess once
]

CASES = ["random", "own_head", "identical", "ties", "peaked", "flat", "odd_hidden", "overflow"]
FIELDS = ["kld", "jsd_bits", "ear", "nll_ref", "nll_cand", "argmax_ref", "argmax_cand",
          "kld_rev", "entropy_ref", "p_ref_top", "q_ref_top", "top5_overlap", "top10_overlap"]
EXACT = ("argmax_ref", "argmax_cand", "top5_overlap", "top10_overlap")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory,
            once_per_session: Callable[[str, Callable[[], Any]], Any]) -> dict[str, np.ndarray]:
    # once per session: the xdist_group above keeps the module on one worker (harness.plugin.pytest_plugin); a run
    # without --dist loadgroup spreads it, and the other worker reads the first one's results
    def build() -> dict[str, np.ndarray]:
        out = tmp_path_factory.mktemp("fused") / "fused.npz"
        env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
        script = Path(__file__).with_name("fused_kl_cases.py")
        root = Path(__file__).resolve().parents[1]
        proc = subprocess.run([sys.executable, str(script), str(out)], env=env, cwd=root, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        with np.load(out) as z:
            return {k: z[k] for k in z.files}

    return once_per_session("test_fused_kl-results", build)


def reference64(r: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    """Float64 metrics from the (bf16-valued) inputs: the definitions of docs/design.md, section 2."""
    ref, cand, head, y = (r[f"{name}/in/{k}"].astype(np.float64) for k in ("ref", "cand", "head", "y"))
    y = y.astype(np.int64)
    chead = r.get(f"{name}/in/cand_head")
    chead = head if chead is None else chead.astype(np.float64)
    la, lb = ref @ head.T, cand @ chead.T

    def logsoftmax(x: np.ndarray) -> np.ndarray:
        m = x.max(1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))

    lp, lq = logsoftmax(la), logsoftmax(lb)
    p, q = np.exp(lp), np.exp(lq)
    mix = 0.5 * (p + q)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl_pm = np.where(p > 0, p * (lp - np.log(mix)), 0.0).sum(1)
        kl_qm = np.where(q > 0, q * (lq - np.log(mix)), 0.0).sum(1)
    rows = np.arange(len(y))
    return {
        "kld": (p * (lp - lq)).sum(1),
        "jsd_bits": 0.5 * (kl_pm + kl_qm) / np.log(2),
        "ear": np.minimum(p, q).sum(1),
        "nll_ref": -lp[rows, y],
        "nll_cand": -lq[rows, y],
        "argmax_ref": la.argmax(1),
        "argmax_cand": lb.argmax(1),
        "kld_rev": (q * (lq - lp)).sum(1),
        "entropy_ref": -(np.where(p > 0, p * lp, 0.0)).sum(1),
        "p_ref_top": p.max(1),
        "q_ref_top": q[rows, la.argmax(1)],
        **{f"top{k}_overlap": _overlap(la, lb, k) for k in (5, 10)},
    }


def _overlap(la: np.ndarray, lb: np.ndarray, k: int) -> np.ndarray:
    """Shared ids of the k largest float64 logits of each row (ties to the lowest id: a stable sort)."""
    a = np.argsort(-la, axis=1, kind="stable")[:, :k]
    b = np.argsort(-lb, axis=1, kind="stable")[:, :k]
    return np.array([len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b)])


def close(got: np.ndarray, want: np.ndarray, field: str, rtol: float = 1e-4) -> None:
    if field in EXACT:
        np.testing.assert_array_equal(got, want, err_msg=field)
        return
    atol = {"kld": 1e-6, "jsd_bits": 1e-6, "ear": 1e-5, "nll_ref": 1e-4, "nll_cand": 1e-4, "kld_rev": 1e-6,
            "entropy_ref": 1e-5, "p_ref_top": 1e-6, "q_ref_top": 1e-6}[field]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=field)


@pytest.mark.parametrize("name", [c for c in CASES if c != "overflow"])
def test_fused_matches_float64_reference(results, name: str) -> None:
    want = reference64(results, name)
    for f in FIELDS:
        if name == "flat" and f in EXACT:
            continue  # logits ~1e-2 apart: fp32 and float64 may legitimately pick different maxima
        close(results[f"{name}/fused/{f}"], want[f], f)


@pytest.mark.parametrize("name", CASES)
def test_fused_matches_torch_path(results, name: str) -> None:
    """The two backends agree (docs: |delta KL| <= 1e-6 + 1e-4 KL), and score_hidden(backend="triton") is the kernel.

    "peaked" has logits of magnitude ~200 (far beyond a real LM's ~30): both paths' fp32 GEMM
    rounding (~1e-5 absolute per logit, in different summation orders) then moves KL by ~1e-4
    relative, so it gets rtol 1e-3 (each path still matches the float64 reference to 1e-4)."""
    rtol = 1e-3 if name == "peaked" else 1e-4
    for f in FIELDS:
        t, k = results[f"{name}/torch/{f}"], results[f"{name}/fused/{f}"]
        if f in EXACT:
            if name != "flat":
                np.testing.assert_array_equal(k, t, err_msg=f)
        else:
            close(k, t, f, rtol)
        if f"{name}/via/{f}" in results:  # the dispatch, saved for two cases (tests/fused_kl_cases.py: VIA)
            np.testing.assert_array_equal(results[f"{name}/via/{f}"], k, err_msg=f)


def test_dispatch_was_checked(results) -> None:
    """score_hidden(backend="triton") ran the kernel with the shared head and with a candidate's own head."""
    assert {k.split("/")[0] for k in results if "/via/" in k} == {"odd_hidden", "overflow"}
    assert "overflow/in/cand_head" in results and "odd_hidden/in/cand_head" not in results


def test_identical_operands_are_exactly_zero(results) -> None:
    assert np.all(results["identical/fused/kld"] == 0.0)
    assert np.all(results["identical/fused/jsd_bits"] == 0.0)
    assert np.all(results["identical/fused/ear"] == 1.0)
    assert np.all(results["identical/fused/kld_rev"] == 0.0)
    np.testing.assert_array_equal(results["identical/fused/q_ref_top"], results["identical/fused/p_ref_top"])
    assert np.all(results["identical/fused/top10_overlap"] == 10) and np.all(results["identical/fused/top5_overlap"] == 5)
    np.testing.assert_array_equal(results["identical/fused/argmax_ref"], results["identical/fused/argmax_cand"])


def test_ties_go_to_lowest_id(results) -> None:
    """The case is a real, exact tie (float64 logits of ids 3, 67, 999 equal and maximal in every row),
    and both backends resolve it to the lowest id."""
    ref, cand, head = (results[f"ties/in/{k}"].astype(np.float64) for k in ("ref", "cand", "head"))
    for x in (ref, cand):
        la = x @ head.T
        assert np.all(la[:, 3] == la[:, 67]) and np.all(la[:, 3] == la[:, 999])
        others = np.delete(la, [3, 67, 999], axis=1)
        assert np.all(la[:, 3] > others.max(1) + 1.0), "the tied logit must be the clear maximum"
        # every partial sum is on the 2^-8 grid below 2^24 ulps: exact in fp32 in any order
        grid = x[:, None, :] * head[None, [3, 67, 999], :] * 256
        assert np.all(grid == np.round(grid)) and np.abs(grid).sum(2).max() < 2**24
    for backend in ("fused", "torch"):
        assert np.all(results[f"ties/{backend}/argmax_ref"] == 3), backend
        assert np.all(results[f"ties/{backend}/argmax_cand"] == 3), backend


def test_tiny_divergence_keeps_relative_accuracy(results) -> None:
    """The cancellation-free KL: small per-position KLs keep their relative accuracy."""
    want = reference64(results, "random")["kld"]
    got = results["random/fused/kld"]
    small = want < 1e-3
    assert small.any()
    np.testing.assert_allclose(got[small], want[small], rtol=2e-3, atol=1e-9)


def test_overflow_rows_fall_back_to_torch(results) -> None:
    assert not np.all(np.isfinite(results["overflow/raw/kld"])), "the case should overflow phase 1"
    want = reference64(results, "overflow")
    for f in FIELDS:
        close(results["overflow/fused/" + f], want[f], f)


def test_phase1_only_marks_jsd_ear_nan(results) -> None:
    assert np.all(np.isnan(results["nojsd/jsd_bits"])) and np.all(np.isnan(results["nojsd/ear"]))
    np.testing.assert_array_equal(results["nojsd/kld"], results["odd_hidden/fused/kld"])  # fused_kl_cases.NOJSD


def test_gpu_check_script_dry_run_on_cpu() -> None:
    """benchmarks/gpu_check.py end to end on a CPU under the interpreter (tiny shapes): the script the
    GPU machine will run has no Python-level errors, and its agreement step passes."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "gpu_check.py"), "--dry-run-cpu", "--positions", "32", "--hidden", "32",
         "--vocab", "300", "--subset-positions", "16", "--sweep-positions", "16", "--reps", "1", "--configs", "16,64,32,1,1"],
        env=env, cwd=root, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "status: agreement OK" in proc.stdout and "| fused phase 1 / bare bf16 GEMMs (goal <= 1.15) |" in proc.stdout
