"""The cross-engine floor matrix (:mod:`harness.run.cross_engine`) on a tiny project: pairs of
hidden-state and logits captures in every role (a logits store as the reference side too), checked
against a float64 softmax/KL computed by hand; the direction of each cell; net-of-floor rows;
rendering, the JSON round trip and the plugin's report writer. Engines are stand-ins here (the
transformers engine capturing hidden states or logits), so nothing needs llama.cpp or vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest


@pytest.fixture(scope="module")
def stores(fidelity_project: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from harness.capture.loop import capture
    from harness.capture.store import CaptureStore
    from harness.engines.base import EngineOptions
    from harness.inputs.head import load_head
    from harness.inputs.suite import Suite

    root = fidelity_project
    tmp = tmp_path_factory.mktemp("floors")
    suite = Suite.load(root / "suite")
    s: dict[str, Any] = {"suite": suite, "head": load_head(root / "lm_head.safetensors"),
                         "ref": CaptureStore.open(root / "reference", suite)}
    s["ref_again"] = capture("transformers", root / "models" / "reference", suite, tmp / "ref_again", shards=[0], progress=False)
    s["good_l"] = capture("transformers", root / "models" / "good", suite, tmp / "good_l", shards=[0], progress=False, kind="logits", options=EngineOptions(dtype="float32"))
    s["bad_h"] = capture("transformers", root / "models" / "bad", suite, tmp / "bad_h", shards=[0], progress=False)
    s["bad_l"] = capture("transformers", root / "models" / "bad", suite, tmp / "bad_l", shards=[0], progress=False, kind="logits", options=EngineOptions(dtype="float32"))
    s["sharp_l"] = _sharpened(s["ref"], s["head"].weight, suite, tmp / "sharp_l")
    return s


def _sharpened(ref: Any, head: Any, suite: Any, out: Path) -> Any:
    """A logits store of the reference's logits x 10 (sharper distributions): KL(P || Q) and KL(Q || P)
    of it against the reference differ by far more than any rounding."""

    from harness.capture.store import CaptureStore, StoreWriter

    with StoreWriter(out, suite, "logits", int(head.shape[0]), "float32", {"name": "sharpened"}, {"name": "by-hand"},
                     {"python": "test"}, "cpu") as w:
        for i in suite.shard_indices(0):
            w.write(i, 10.0 * (ref.load(i).float() @ head.float().T))
    return CaptureStore.open(out, suite)


def _pair(s: dict[str, Any], r: str, c: str) -> Any:
    from harness.run.cross_engine import score_pair

    cell, scores = score_pair(suite=s["suite"], shard=0, reference=s[r], candidate=s[c], head=s["head"], reference_engine=r,
                              candidate_engine=c)
    assert cell.n_positions == len(scores) == len(s["suite"].shard_indices(0)) * (s["suite"].n_ctx - 1)
    return cell


@pytest.mark.parametrize("r,c,mode", [
    ("ref", "bad_h", "hidden_states"),
    ("ref", "good_l", "logits (reference through head)"),
    ("good_l", "ref", "logits (candidate through head)"),  # a logits store as the reference side
    ("bad_l", "good_l", "logits"),
    ("bad_l", "ref", "logits (candidate through head)"),
])
def test_cell_matches_float64(stores: dict[str, Any], r: str, c: str, mode: str, store_kl64: Any) -> None:
    cell = _pair(stores, r, c)
    kl, agree = store_kl64(stores[r], stores[c], stores["suite"], stores["head"])
    assert cell.mode == mode and (cell.reference, cell.candidate) == (r, c)
    assert cell.n_positions == kl.size
    assert cell.mean_kld == pytest.approx(kl.mean(), rel=1e-3)
    assert cell.p99 == pytest.approx(np.quantile(kl, 0.99), rel=1e-2)
    assert abs(cell.top1 - agree.mean()) <= 2 / kl.size


def test_direction_is_row_as_reference(stores: dict[str, Any], store_kl64: Any) -> None:
    """KL is asymmetric: cell (R, C) is KL(P_R || Q_C), and its mirror is the other direction."""
    fwd, back = _pair(stores, "ref", "sharp_l"), _pair(stores, "sharp_l", "ref")
    kl_rc, _ = store_kl64(stores["ref"], stores["sharp_l"], stores["suite"], stores["head"])
    kl_cr, _ = store_kl64(stores["sharp_l"], stores["ref"], stores["suite"], stores["head"])
    assert abs(kl_rc.mean() - kl_cr.mean()) > 0.2 * kl_rc.mean()  # the directions really differ here
    assert fwd.mean_kld == pytest.approx(kl_rc.mean(), rel=1e-3) and back.mean_kld == pytest.approx(kl_cr.mean(), rel=1e-3)
    assert fwd.direction == "KL(ref || sharp_l)" and back.direction == "KL(sharp_l || ref)"


def test_same_model_captured_twice_is_zero(stores: dict[str, Any]) -> None:
    cell = _pair(stores, "ref", "ref_again")
    assert cell.mean_kld <= 1e-9 and cell.top1 == 1.0


def test_logits_reference_needs_a_head_of_its_vocabulary(stores: dict[str, Any]) -> None:
    from harness.errors import VerificationError
    from harness.run.verify import check_widths

    with pytest.raises(VerificationError, match="head.*logits reference"):
        check_widths(stores["suite"], stores["good_l"], stores["ref"], None)
    check_widths(stores["suite"], stores["good_l"], stores["ref"], stores["head"])


def _matrix(stores: dict[str, Any]) -> Any:
    from harness.run.cross_engine import FloorMatrix

    m = FloorMatrix(("ref", "good_l", "gone"), 0, floor_row="ref")
    for r, c in (("ref", "ref_again"), ("ref", "good_l"), ("good_l", "ref"), ("good_l", "good_l")):
        cell = _pair(stores, r, c)
        m.add(cell if c != "ref_again" else type(cell)("ref", "ref", cell.mean_kld, cell.p99, cell.top1, cell.n_positions, cell.mode))
    for e in m.engines:
        m.skip("gone", e, "gone is not importable (install: pip install gone)")
        if e != "gone":
            m.skip(e, "gone", "gone is not importable (install: pip install gone)")
    return m


def test_net_of_floor_rows(stores: dict[str, Any], store_kl64: Any) -> None:
    from harness.run.cross_engine import net_row, skipped_row
    from harness.run.shard import shard_positions
    from harness.run.shard_inputs import ShardInputs

    m = _matrix(stores)
    pos = shard_positions(ShardInputs(suite=stores["suite"], shard=0, reference=stores["ref"], candidate=stores["bad_l"], head=stores["head"]))
    row = net_row("bad", "good_l", "x.toml", pos.scores, m, 123)
    # against the float64 KL computed by hand from the stores: the candidate's, the floor (cell ref -> good_l)
    # and their difference
    kl_bad, _ = store_kl64(stores["ref"], stores["bad_l"], stores["suite"], stores["head"])
    kl_floor, _ = store_kl64(stores["ref"], stores["good_l"], stores["suite"], stores["head"])
    assert row.mean_kld == pytest.approx(kl_bad.mean(), rel=1e-3)
    assert row.floor == pytest.approx(kl_floor.mean(), rel=1e-3)
    assert row.net_of_floor == pytest.approx(kl_bad.mean() - kl_floor.mean(), abs=1e-3 * (kl_bad.mean() + kl_floor.mean()))
    assert row.note == ""
    orphan = net_row("bad2", "gone", "x.toml", pos.scores, m)
    assert orphan.floor is None and orphan.net_of_floor is None and "gone is not importable" in orphan.note
    unknown = net_row("bad3", "other", "x.toml", pos.scores, m)
    assert unknown.net_of_floor is None and "no floor is measured for engine 'other'" in unknown.note
    skipped = skipped_row("bad4", "gone", "x.toml", "gone is not importable", m)
    assert skipped.mean_kld is None and skipped.net_of_floor is None


def test_render_round_trip_and_write(stores: dict[str, Any], tmp_path: Path, store_kl64: Any) -> None:
    from harness.errors import FidelityError
    from harness.plugin.registry import write_extras
    from harness.run.cross_engine import from_json_dict, net_row, render_markdown, to_json_dict
    from harness.run.shard import shard_positions
    from harness.run.shard_inputs import ShardInputs

    m = _matrix(stores)
    pos = shard_positions(ShardInputs(suite=stores["suite"], shard=0, reference=stores["ref"], candidate=stores["bad_h"], head=stores["head"]))
    rows = [net_row("bad", "good_l", "x.toml", pos.scores, m, 99)]
    doc = to_json_dict(m, rows)
    json.dumps(doc, allow_nan=False)
    cells = {(c["reference"], c["candidate"]): c for c in doc["cells"]}
    assert cells[("good_l", "ref")]["direction"] == "KL(good_l || ref)"
    kl_bad, _ = store_kl64(stores["ref"], stores["bad_h"], stores["suite"], stores["head"])
    kl_floor, _ = store_kl64(stores["ref"], stores["good_l"], stores["suite"], stores["head"])
    assert doc["candidates"][0]["net_of_floor"] == pytest.approx(kl_bad.mean() - kl_floor.mean(),
                                                                 abs=1e-3 * (kl_bad.mean() + kl_floor.mean()))
    m2, rows2 = from_json_dict(doc)
    assert m2.cells == m.cells and m2.skipped == m.skipped and rows2 == rows
    md = render_markdown(m, rows)
    assert "KL(P_R ‖ Q_C)" in md and "| **gone** | skipped | skipped | skipped |" in md
    assert "- skipped KL(gone || ref): gone is not importable" in md
    assert "| bad | good_l | x.toml |" in md and f"{rows[0].net_of_floor:+.3e}" in md
    with pytest.raises(FidelityError, match="schema"):
        from_json_dict({**doc, "schema": "other"}, "payload.json")
    with pytest.raises(FidelityError, match="scored; it cannot also be skipped"):
        m.skip("ref", "good_l", "no")
    lines = write_extras(tmp_path, {"cross_engine": [doc]})
    assert (tmp_path / "cross_engine.md").read_text("utf-8") == md
    assert json.loads((tmp_path / "cross_engine.json").read_text("utf-8")) == doc
    assert any("KL(P_R ‖ Q_C)" in line for line in lines) and any("| bad | good_l |" in line for line in lines)
