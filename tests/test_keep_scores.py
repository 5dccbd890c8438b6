"""Score while capturing (``keep = "scores"``, harness/run/live_scores.py) on the embedded model in fixtures/: the
shard reports equal the store-then-score path's byte for byte (timing aside) through pytest, ``fidelity ladder``,
pytest-xdist and Ray; no candidate hidden state is written (the cache folder is listed); a run killed with SIGKILL
resumes at the first context without scores and gives the same numbers. The store path's reports, scored from a
capture store as every other test does, are the independent side of each comparison."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from harness.capture.store import CaptureStore
from harness.engines.base import EngineOptions
from harness.engines.registry import get_engine
from harness.inputs.config import ConfigError, load_config
from harness.inputs.head import load_head
from harness.inputs.suite import Suite
from harness.run.live_scores import capture_scored
from harness.scoring.scorer import score_hidden

#: `-n 2 --dist loadgroup`: the module's tests stay on one worker, except its Ray test, which is in the Ray tests'
#: group only (one local Ray cluster at a time). A module-wide mark would name both groups on that test, a group
#: of its own ("keep_scores_ray") that could run beside the other Ray tests; so each test carries its mark.
KEEP_SCORES = pytest.mark.xdist_group("keep_scores")

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures"
SHARD = 0
SCORE_FIELDS = ("kld", "jsd_bits", "ear", "nll_ref", "nll_cand", "argmax_ref", "argmax_cand", "kld_rev",
                "entropy_ref", "p_ref_top", "q_ref_top", "top5_overlap", "top10_overlap")


def write_config(folder: Path, keep: str, *, engine: str | None = None, store: bool = False,
                 model: Path = FIX / "candidates" / "int8") -> Path:
    """A configuration of the fixtures' int8 candidate (``keep``), with its own cache and baselines in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    source = f'store = "{FIX / "reference"}"' if store else f'model = "{model}"'
    (folder / "fidelity.toml").write_text(f"""
[suite]
path = "{FIX / "suite"}"
[reference]
name = "bf16"
store = "{FIX / "reference"}"
head = "{FIX / "lm_head.safetensors"}"
[settings]
cache_dir = "{folder / "cache"}"
baselines = "{folder / "baselines"}"
n_boot = 300
[[candidates]]
name = "int8"
{source}
{f'engine = "{engine}"' if engine else ""}
keep = "{keep}"
""", "utf-8")
    return folder / "fidelity.toml"


def reports(folder: Path) -> dict[str, Any]:
    """Every shard report under ``folder`` without its ``timing`` block and ``created`` time (facts of one run)."""
    out = {}
    for p in sorted(folder.rglob("shard-*.json")):
        doc = json.loads(p.read_text())
        doc.pop("timing")
        doc.pop("created")
        out[str(p.relative_to(folder))] = doc
    assert out, f"no shard report under {folder}"
    return out


#: Every run this module compares holds one torch thread count (``FIDELITY_THREADS``): left to the load average, a
#: pytest run on a busy machine takes 1 thread and a quiet one 2, and the bf16 forwards then sum in another order
#: (numbers that differ in the 3rd digit of a reverse KLD of 1e-4), so "the same report" would depend on the load.
THREADS_ENV = {"FIDELITY_THREADS": "1"}


def run_pytest(config: Path, report_dir: Path, *extra: str, update: bool = True) -> str:
    """``pytest CONFIG`` on shard 0 (recording the baselines unless ``update`` is false), one torch thread per
    process (:data:`THREADS_ENV`); its output."""
    cmd = [sys.executable, "-m", "pytest", str(config), "-q", "-p", "no:cacheprovider", "-m", "fidelity",
           "--fidelity-shards", str(SHARD), *(["--fidelity-update-baselines"] if update else []), "--fidelity-no-floor",
           "--fidelity-report-dir", str(report_dir), *extra]
    out = subprocess.run(cmd, cwd=config.parent, capture_output=True, text=True, env={**os.environ, **THREADS_ENV},
                         check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def cache_files(config: Path) -> list[str]:
    folder = config.parent / "cache"
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory,
           once_per_session: Callable[[str, Callable[[], Any]], Any]) -> dict[str, Any]:
    """The store-then-score path's shard report of int8 x shard 0 (through pytest), and its capture store (read only
    by its users). Built once per session: the Ray test runs on the Ray group's worker, the others on the
    keep_scores group's, and the second to need it reads the first one's (a pytest run of the shard, ~17 s in CI)."""
    def build() -> dict[str, Any]:
        config = write_config(tmp_path_factory.mktemp("store"), "store")
        run_pytest(config, config.parent / "reports")
        stores = sorted((config.parent / "cache" / "captures").glob("int8-*"))
        assert len(stores) == 1 and list(stores[0].glob("ctx-*.safetensors"))
        return {"reports": reports(config.parent / "reports"), "store": stores[0]}

    out: dict[str, Any] = once_per_session("test_keep_scores-stored", build)
    return out


@KEEP_SCORES
def test_keep_is_validated(tmp_path: Path) -> None:
    assert load_config(write_config(tmp_path / "a", "scores")).candidate("int8").keep == "scores"
    assert load_config(write_config(tmp_path / "b", "store")).candidate("int8").keep == "store"
    with pytest.raises(ConfigError, match=r"candidates\[0\]\.keep of 'int8': expected one of 'store', 'scores', found 'disk'"):
        load_config(write_config(tmp_path / "c", "disk"))
    with pytest.raises(ConfigError, match="expected an engine that captures hidden states .* engine 'llamacpp'"):
        load_config(write_config(tmp_path / "d", "scores", engine="llamacpp", model=FIX / "gguf" / "fixture-q8_0.gguf"))
    with pytest.raises(ConfigError, match="expected 'store' for a stored capture .* found 'scores'"):
        load_config(write_config(tmp_path / "e", "scores", store=True))


@KEEP_SCORES
def test_tiles_across_contexts_score_as_one_call(tmp_path: Path, stored: dict[str, Any]) -> None:
    """Tiles of 100 rows cut the 255-row contexts anywhere: each tile scored as soon as its rows are captured gives
    the numbers of one score_hidden call over the stored capture of the shard with the same tiles."""
    suite = Suite.load(FIX / "suite")
    head = load_head(FIX / "lm_head.safetensors")
    ref = CaptureStore.open(FIX / "reference", suite)
    cand = CaptureStore.open(stored["store"], suite)
    indices = list(suite.shard_indices(SHARD))
    targets = torch.from_numpy(suite.tokens[indices, 1:].astype(np.int64).reshape(-1))
    whole = score_hidden(ref.load_rows(indices), cand.load_rows(indices), head.weight, targets, tile_rows=100)
    loaded = get_engine("transformers").load(FIX / "candidates" / "int8", suite.n_ctx, "hidden_states", EngineOptions())
    try:
        live = capture_scored(lambda: loaded, model=FIX / "candidates" / "int8", engine="transformers", suite=suite,
                              shard=SHARD, reference=ref, head=head, cand_head=None, device="cpu",
                              work=tmp_path / "parts", key=b"k" * 32, bound={"test": 1}, tile_rows=100)
    finally:
        loaded.close()
    names = sorted(p.name for p in (tmp_path / "parts").iterdir())
    assert names[:3] == ["part-000000000.npz", "part-000000100.npz", "part-000000200.npz"] and len(names) == 41
    assert len(live.positions.row) == len(indices) * (suite.n_ctx - 1) and live.captured == indices
    for f in SCORE_FIELDS:
        assert np.array_equal(getattr(live.positions.scores, f), getattr(whole, f)), f


@KEEP_SCORES
def test_pytest_gives_the_store_paths_reports_and_writes_no_hidden_states(tmp_path: Path, stored: dict[str, Any]) -> None:
    config = write_config(tmp_path, "scores")
    out = run_pytest(config, tmp_path / "reports")
    assert reports(tmp_path / "reports") == stored["reports"]
    files = cache_files(config)
    assert not any(f.startswith("captures/") or f.endswith(".safetensors") for f in files), files
    assert [f for f in files if f.endswith(".npz")] == [f for f in files if f.startswith("scores/int8-shard00-")]
    assert "score cache: reused 0 of 1 shards" in out
    again = run_pytest(config, tmp_path / "reports2")  # a rerun reads the kept scores
    assert "score cache: reused 1 of 1 shards" in again and reports(tmp_path / "reports2") == stored["reports"]


@KEEP_SCORES
def test_ladder_cli_gives_the_store_paths_reports(tmp_path: Path, stored: dict[str, Any]) -> None:
    config = write_config(tmp_path, "scores")
    out = subprocess.run([sys.executable, "-m", "harness", "ladder", str(config), "--shards", str(SHARD), "--out",
                          str(tmp_path / "reports"), "--device", "cpu", "--quiet"],
                         cwd=tmp_path, capture_output=True, text=True, env={**os.environ, **THREADS_ENV}, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert reports(tmp_path / "reports") == stored["reports"]
    assert not any(f.startswith("captures/") for f in cache_files(config))


@KEEP_SCORES
def test_xdist_gives_the_store_paths_reports(tmp_path: Path, stored: dict[str, Any]) -> None:
    config = write_config(tmp_path, "scores")
    out = run_pytest(config, tmp_path / "reports", "-n", "2", "-m", "fidelity or fidelity_tails", update=False)
    # two workers (the shard case and the tails case) need int8 x shard 0: one scores it, the other reads its entry
    assert "bringing up nodes" in out and "1 passed, 1 skipped" in out
    assert len(list((tmp_path / "cache" / "scores").glob("int8-shard00-*.npz"))) == 1
    assert reports(tmp_path / "reports") == stored["reports"]
    assert not any(f.startswith("captures/") for f in cache_files(config))


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # `-n 2 --dist loadgroup`: one local Ray cluster at a time, on one worker
def test_ray_gives_the_store_paths_reports(tmp_path: Path, stored: dict[str, Any]) -> None:
    pytest.importorskip("ray")
    config = write_config(tmp_path, "scores")
    run_pytest(config, tmp_path / "reports", "--fidelity-executor", "ray")
    assert reports(tmp_path / "reports") == stored["reports"]
    assert not any(f.startswith("captures/") for f in cache_files(config))


_KILLED_RUN = """
import os, signal, sys
from harness.engines import transformers as tf
from harness.inputs.config import load_config
from harness.run.session import FidelitySession
from harness.scoring.threads import apply_default_threads

apply_default_threads()  # FIDELITY_THREADS, as the runs it is compared with

kill_at, log = int(sys.argv[2]), open(sys.argv[3], "a")
forward = tf.TransformersLoaded.forward
calls = []

def counted(self, token_ids, kind):
    out = forward(self, token_ids, kind)
    calls.append(1)
    log.write(f"{len(calls)}\\n"); log.flush()
    if len(calls) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return out

tf.TransformersLoaded.forward = counted
session = FidelitySession(load_config(sys.argv[1]))
import json
report = session.score(session.config.candidate("int8"), 0).report
print(len(calls), json.dumps(report.to_json_dict(), sort_keys=True))
"""


@KEEP_SCORES
def test_a_run_killed_with_sigkill_resumes_at_the_first_context_without_scores(tmp_path: Path,
                                                                               stored: dict[str, Any]) -> None:
    """The shard's 16 contexts are scored in tiles of 4 (1,020 rows of 255); killed right after the 10th forward,
    two tiles (8 contexts) are on disk: the rerun captures the other 8 only, and reports the store path's numbers."""
    config = write_config(tmp_path, "scores")
    script = tmp_path / "run.py"
    script.write_text(_KILLED_RUN, "utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), **THREADS_ENV}
    first = subprocess.run([sys.executable, str(script), str(config), "10", str(tmp_path / "first.log")],
                           capture_output=True, text=True, env=env, check=False)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    parts = sorted(p.name for p in (tmp_path / "cache" / "scores").glob(".*.parts/*"))
    assert parts == ["part-000000000.npz", "part-000001020.npz"], parts
    second = subprocess.run([sys.executable, str(script), str(config), "0", str(tmp_path / "second.log")],
                            capture_output=True, text=True, env=env, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    n, _, text = second.stdout.strip().splitlines()[-1].partition(" ")
    assert int(n) == 8
    doc = json.loads(text)
    doc.pop("timing")
    doc.pop("created")
    assert doc == next(iter(stored["reports"].values()))
    assert not list((tmp_path / "cache" / "scores").glob(".*.parts"))  # the parts go once the entry is kept


@KEEP_SCORES
def test_parts_are_believed_only_when_signed_and_bound(tmp_path: Path, fidelity_project: Path) -> None:
    """On the tiny project (2 contexts of 31 rows a shard, tiles of 20 rows): a finished shard's parts are read, the
    model never loaded; a part signed with another key, or bound to other inputs, is not believed: that tile and the
    ones after it are scored again, capturing again only from the first context without all of its scores."""
    suite = Suite.load(fidelity_project / "suite")
    head = load_head(fidelity_project / "lm_head.safetensors")
    ref = CaptureStore.open(fidelity_project / "reference", suite)
    loads: list[int] = []

    def run(key: bytes = b"k" * 32, bound: dict[str, Any] | None = None) -> Any:
        def open_model() -> Any:
            loads.append(1)
            return get_engine("transformers").load(fidelity_project / "models" / "good", suite.n_ctx, "hidden_states",
                                                   EngineOptions())
        return capture_scored(open_model, model=fidelity_project / "models" / "good", engine="transformers",
                              suite=suite, shard=1, reference=ref, head=head, cand_head=None, device="cpu",
                              work=tmp_path / "parts", key=key, bound=bound or {"inputs": 1}, tile_rows=20)

    first = run()
    indices = list(suite.shard_indices(1))
    assert first.captured == indices and len(loads) == 1
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == [f"part-{r:09d}.npz" for r in (0, 20, 40, 60)]
    again = run()
    assert again.captured == [] and len(loads) == 1 and again.header == first.header
    for f in SCORE_FIELDS:
        assert np.array_equal(getattr(again.positions.scores, f), getattr(first.positions.scores, f)), f
    forged = tmp_path / "parts" / "part-000000040.npz"
    forged.write_bytes((tmp_path / "parts" / "part-000000020.npz").read_bytes())  # a real part, of other rows
    resumed = run()
    assert resumed.captured == indices[1:] and len(loads) == 2  # rows 40.. lie in the second context
    for f in SCORE_FIELDS:
        assert np.array_equal(getattr(resumed.positions.scores, f), getattr(first.positions.scores, f)), f
    assert run(key=b"x" * 32).captured == indices and run(bound={"inputs": 2}).captured == indices
