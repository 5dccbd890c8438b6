"""Cross-engine floors (``pytest -m fidelity_cross_engine``): the same bf16 weights through every engine.

The fixture model's unquantized bf16 weights are scored through each engine on shard 0:

* ``transformers`` -- the committed reference capture (bf16 hidden states x the shared head, fp32
  logits), plus a fresh capture on this machine for the diagonal: what the candidates, captured
  here, inherit from running on another machine than the reference (0 where the CPU kernels agree);
* ``vllm`` -- the same model folder through vLLM's pooling runner (hidden states x the shared head);
* ``llamacpp`` -- ``fixtures/gguf/fixture-bf16.gguf`` (llama.cpp's logits, its own bf16 head).

Every ordered pair is scored (:mod:`harness.run.cross_engine`): cell (R, C) = KL(P_R || Q_C),
row engine R the reference distribution, column engine C the candidate; a diagonal cell compares
two captures by one engine (vLLM and llama.cpp: two in this run). Each candidate of ``fidelity.toml`` and ``fidelity-gguf.toml`` is then
shown with floor_E = KL(transformers reference || E on the bf16 weights) of the engine E serving it
and its KLD net of that floor (a label beside its own KLD, never a silent subtraction). The matrix
and the table are printed in the terminal summary and written as ``cross_engine.md`` /
``cross_engine.json`` to the report folder.

An engine that is not importable (or its model file missing) skips only the pairs and candidates
that need it, with the reason. Shard 0 only (16 contexts x 255 positions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = [
    pytest.mark.fidelity_cross_engine,
    # `-n 2 --dist loadgroup`: one worker captures and scores the module's engines once (its module fixtures)
    pytest.mark.xdist_group("cross_engine"),
]

ROOT = Path(__file__).resolve().parent.parent
#: Configurations whose candidates get a net-of-floor row; the first one's reference is the transformers row.
CONFIGS = (ROOT / "fidelity.toml", ROOT / "fidelity-gguf.toml")
ENGINES = ("transformers", "vllm", "llamacpp")
#: The unquantized bf16 weights in llama.cpp's format (the model folder serves transformers and vLLM).
BF16_GGUF = ROOT / "fixtures" / "gguf" / "fixture-bf16.gguf"
SHARD = 0


@dataclass
class BF16Captures:
    """The bf16 weights captured by each engine on shard 0 (``first``) and by the same engine again
    (``second``, the diagonal); ``missing`` gives the reason an engine has no capture."""

    suite: Any
    head: Any
    first: dict[str, Any] = field(default_factory=dict)
    second: dict[str, Any] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _unavailable(engine: str, model: Path | None) -> str:
    """Why ``engine`` cannot run ``model`` here ('' when it can): not importable, or the file missing."""
    from harness.engines.registry import get_engine

    eng = get_engine(engine)
    if not eng.available():
        return f"{engine} is not importable (install: {eng.install_hint})"
    if model is not None and not model.exists():
        return f"{model} missing" + (" (make it with fixtures/make_gguf.py)" if model.suffix == ".gguf" else "")
    return ""


@pytest.fixture(scope="module")
def config() -> Any:
    from harness.inputs.config import load_config

    return load_config(CONFIGS[0])


@pytest.fixture(scope="module")
def captures(config: Any, tmp_path_factory: pytest.TempPathFactory) -> BF16Captures:
    import time

    from harness.capture.loop import capture
    from harness.capture.store import CaptureStore
    from harness.engines.base import EngineOptions
    from harness.inputs.head import load_head
    from harness.inputs.suite import Suite

    suite = Suite.load(config.suite)
    out = BF16Captures(suite, load_head(config.reference.head))
    out.first["transformers"] = CaptureStore.open(config.reference.store, suite)
    tmp = tmp_path_factory.mktemp("cross_engine")
    model = {"transformers": config.reference.model, "vllm": config.reference.model, "llamacpp": BF16_GGUF}
    for engine in ENGINES:
        reason = _unavailable(engine, model[engine])
        if reason:
            out.missing[engine] = reason
            continue
        t0 = time.perf_counter()
        opts = EngineOptions(threads=2) if engine == "llamacpp" else EngineOptions()
        runs = ("second",) if engine == "transformers" else ("first", "second")
        for run in runs:
            getattr(out, run)[engine] = capture(engine, model[engine], suite, tmp / f"{engine}-{run}", shards=[SHARD],
                                                options=opts, progress=False)
        out.seconds[engine] = time.perf_counter() - t0
    return out


@dataclass
class Matrix:
    """The floor matrix and, per scored cell, the harness's per-position KLD (shard order)."""

    floors: Any
    kld: dict[tuple[str, str], np.ndarray]


def _capture_of(captures: BF16Captures, r: str, c: str) -> tuple[Any, Any]:
    """The two stores of cell (r, c): r's first capture as P; c's first capture as Q, or its second on the diagonal."""
    return captures.first[r], captures.second[c] if r == c else captures.first[c]


@pytest.fixture(scope="module")
def scored(captures: BF16Captures) -> Matrix:
    from harness.run.cross_engine import FloorMatrix, score_pair

    m = FloorMatrix(ENGINES, SHARD, floor_row="transformers")
    kld = {}
    for r in ENGINES:
        for c in ENGINES:
            why = "; ".join(dict.fromkeys(captures.missing[e] for e in (r, c) if e in captures.missing))
            if why:
                m.skip(r, c, why)
                continue
            p_store, q_store = _capture_of(captures, r, c)
            cell, scores = score_pair(suite=captures.suite, shard=SHARD, reference=p_store, candidate=q_store,
                                      head=captures.head, reference_engine=r, candidate_engine=c)
            m.add(cell)
            kld[(r, c)] = scores.kld
    for e in ENGINES:
        if e in captures.second:
            a, b = _runtime(captures.first[e]), _runtime(captures.second[e])
            where = "the committed reference capture" if e == m.floor_row else "a first capture"
            m.notes.append(f"KL({e} || {e}): {where} ({a}) vs a second capture in this run ({b})")
    return Matrix(m, kld)


@pytest.fixture(scope="module")
def matrix(scored: Matrix) -> Any:
    return scored.floors


def _runtime(store: Any) -> str:
    """The versions a capture ran with (engine, torch, transformers), from its store header."""
    rt, eng = store.manifest.get("runtime", {}), store.manifest.get("engine", {})
    return f"{eng.get('version', '?')}, torch {rt.get('torch', '?')}, transformers {rt.get('transformers', '?')}"


@pytest.fixture(scope="module")
def net_rows(matrix: Any, config: Any) -> list[Any]:
    """One row per candidate of every configuration, scored against the reference of the floors' row."""
    from harness.inputs.config import load_config
    from harness.run.cross_engine import net_row, skipped_row
    from harness.run.session import FidelitySession, candidate_size_bytes

    rows = []
    for path in CONFIGS:
        cfg = load_config(path)
        if cfg.reference.store.resolve() != config.reference.store.resolve():
            pytest.fail(f"{path}: reference.store: expected {config.reference.store} (the floors' reference, "
                        f"{CONFIGS[0].name}), found {cfg.reference.store}", pytrace=False)
        session = FidelitySession(config=cfg, device="cpu")
        session.plan([(c.name, SHARD) for c in cfg.candidates])
        for cand in cfg.candidates:
            # a stored capture (replay) needs no engine; a live one needs its engine and its model file
            reason = "" if cand.store is not None else _unavailable(cand.engine, cand.model)
            if reason:
                rows.append(skipped_row(cand.name, cand.engine, path.name, reason, matrix))
                continue
            pos = session.positions(cand, SHARD)
            rows.append(net_row(cand.name, cand.engine, path.name, pos.scores, matrix, candidate_size_bytes(cand)))
    return rows


# ----------------------------------------------------------------------------- checks


def _log_softmax64(store: Any, indices: list[int], head: np.ndarray) -> np.ndarray:
    """float64 log-softmax of a capture's shard rows, by hand: a logits store as stored, hidden states x the head."""
    out = []
    for i in indices:
        x = store.load(i).double().numpy()
        x = x if store.kind == "logits" else x @ head.T
        x = x - x.max(axis=1, keepdims=True)
        out.append(x - np.log(np.exp(x).sum(axis=1, keepdims=True)))
    return np.concatenate(out)


@pytest.fixture(scope="module")
def logp64(captures: BF16Captures) -> dict[int, np.ndarray]:
    """Each capture's float64 log-probabilities (by ``id`` of the store), computed once."""
    head = captures.head.weight.double().numpy()
    idx = captures.suite.shard_indices(SHARD)
    stores = {id(st): st for run in (captures.first, captures.second) for st in run.values()}
    return {k: _log_softmax64(st, idx, head) for k, st in stores.items()}


def _kl64(lp: np.ndarray, lq: np.ndarray) -> np.ndarray:
    return np.asarray((np.exp(lp) * (lp - lq)).sum(axis=1))


def test_every_cell_matches_float64(scored: Matrix, captures: BF16Captures, logp64: dict[int, np.ndarray]) -> None:
    """Each scored cell recomputed from its two captures with a float64 softmax and KL by hand (the
    row capture as P, the column capture as Q): mean KLD, p99 and top-1 agree with the harness."""
    if not scored.floors.cells:
        pytest.skip("no pair scored")
    for (r, c), cell in scored.floors.cells.items():
        p_store, q_store = _capture_of(captures, r, c)
        lp, lq = logp64[id(p_store)], logp64[id(q_store)]
        k, a = _kl64(lp, lq), lp.argmax(axis=1) == lq.argmax(axis=1)
        assert cell.n_positions == k.size == len(captures.suite.shard_indices(SHARD)) * (captures.suite.n_ctx - 1)
        # fp32 logits against float64 ones: a relative 1e-3 plus an absolute 1e-8 nats (a 0 diagonal)
        assert abs(cell.mean_kld - k.mean()) <= 1e-3 * k.mean() + 1e-8, (r, c, cell.mean_kld, k.mean())
        assert abs(cell.p99 - np.quantile(k, 0.99)) <= 1e-2 * np.quantile(k, 0.99) + 1e-8, (r, c)
        assert abs(cell.top1 - a.mean()) <= 3 / k.size, (r, c, cell.top1, a.mean())


def test_direction_of_each_cell(scored: Matrix, captures: BF16Captures, logp64: dict[int, np.ndarray]) -> None:
    """KL is asymmetric: cell (R, C) is KL(P_R || Q_C). For each off-diagonal cell the harness's
    per-position KLD is the float64 KL with R's capture as P, and nearer to it than to the reverse
    direction KL(P_C || Q_R)."""
    off = [(r, c) for (r, c) in scored.floors.cells if r != c]
    if not off:
        pytest.skip("no cross-engine pair scored (needs vllm or llama_cpp)")
    for r, c in off:
        cell = scored.floors.cell(r, c)
        assert cell.direction == f"KL({r} || {c})" and (cell.reference, cell.candidate) == (r, c)
        lp, lq = logp64[id(captures.first[r])], logp64[id(captures.first[c])]
        forward, backward = _kl64(lp, lq), _kl64(lq, lp)
        mine = scored.kld[(r, c)]
        err_fwd, err_back = np.abs(mine - forward).sum(), np.abs(mine - backward).sum()
        assert err_fwd <= 1e-3 * forward.sum(), (r, c, err_fwd)
        assert err_fwd < 0.5 * err_back, (r, c, err_fwd, err_back)


def test_diagonal_is_noise(matrix: Any) -> None:
    """An engine against itself -- two captures of the same weights; for transformers the committed
    reference (captured on another machine) against a capture on this one -- is 0 or at
    floating-point noise: below half of every cross-engine cell of that engine, argmaxes agreeing."""
    assert matrix.cell("transformers", "transformers") is not None
    for (e, k), cell in matrix.cells.items():
        if e != k:
            continue
        assert cell.top1 > 0.99, cell
        cross = [c.mean_kld for (r, q), c in matrix.cells.items() if r != q and e in (r, q)]
        if cross:
            assert cell.mean_kld < 0.5 * min(cross), (cell, min(cross))


def test_floors_are_small(matrix: Any) -> None:
    """Same weights, different kernels: every cross-engine cell is small and the argmaxes agree."""
    off = {k: c for k, c in matrix.cells.items() if k[0] != k[1]}
    if not off:
        pytest.skip("no cross-engine pair scored (needs vllm or llama_cpp)")
    for (r, c), cell in off.items():
        assert 0 < cell.mean_kld < 1e-3, (r, c, cell)
        assert cell.top1 > 0.97, (r, c, cell)


def test_skips_name_their_reason(matrix: Any, captures: BF16Captures) -> None:
    """Exactly the pairs that need a missing engine are skipped, each with that engine's reason."""
    for r in ENGINES:
        for c in ENGINES:
            need = [e for e in (r, c) if e in captures.missing]
            if need:
                assert (r, c) in matrix.skipped and matrix.cell(r, c) is None
                assert all(captures.missing[e] in matrix.skipped[(r, c)] for e in need)
            else:
                assert matrix.cell(r, c) is not None and (r, c) not in matrix.skipped


def test_net_of_floor(matrix: Any, net_rows: list[Any]) -> None:
    """Every configured candidate has a row; net = its own mean KLD − the floor of its engine, the floor
    beside it; a GGUF quant scores above llama.cpp's floor, Q8_0 below Q4_0."""
    from harness.inputs.config import load_config

    names = [c.name for p in CONFIGS for c in load_config(p).candidates]
    assert [r.candidate for r in net_rows] == names
    for r in net_rows:
        f = matrix.floor(r.engine)
        if r.mean_kld is None:
            assert r.note and r.net_of_floor is None
            continue
        if f is None:
            assert r.floor is None and r.net_of_floor is None and r.note
            continue
        assert r.floor == f.mean_kld and r.net_of_floor == pytest.approx(r.mean_kld - f.mean_kld, rel=1e-12, abs=0)
        assert r.mean_kld > 0
    gguf = {r.candidate: r for r in net_rows if r.engine == "llamacpp" and r.mean_kld is not None and r.floor is not None}
    for name, r in gguf.items():
        if "floor" not in load_config(CONFIGS[1]).candidate(name).tags:
            assert r.net_of_floor is not None and r.net_of_floor > 0, f"{name} scores below llama.cpp's floor"
    if "q8_0" in gguf and "q4_0" in gguf:
        assert gguf["q8_0"].mean_kld < gguf["q4_0"].mean_kld


def test_report(matrix: Any, net_rows: list[Any], captures: BF16Captures, request: pytest.FixtureRequest) -> None:
    """The matrix and the net table go to the terminal summary and to cross_engine.md / .json."""
    from harness.plugin.run import active_run
    from harness.run.cross_engine import from_json_dict, render_markdown, to_json_dict

    doc = to_json_dict(matrix, net_rows)
    m2, rows2 = from_json_dict(doc)
    assert render_markdown(m2, rows2) == render_markdown(matrix, net_rows)
    md = render_markdown(matrix, net_rows)
    assert "KL(P_R || Q_C)" in md and "net of floor" in md
    for r in net_rows:
        assert f"| {r.candidate} | {r.engine} |" in md
    active_run(request.config).send(request, "cross_engine", doc)
    for engine, s in sorted(captures.seconds.items()):
        print(f"capture of the bf16 weights through {engine}: {s:.1f} s")
