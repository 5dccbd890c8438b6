"""``fidelity attribute`` on a candidate whose drift was planted in one known group.

The candidate is built here from ``fixtures/model`` with the project's own quantization code
(``fixtures/make_candidates.py``: ``quant_int_sym``, packed by ``harness.engines.quant_weights``): every
decoder linear is int8 (group 32) except the ``v_proj`` of every layer, which gets int3 codes (same
8-bit container). The attribution by module kind must rank ``v_proj`` first with an interval above zero.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # captures the fixture model in-process

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "fixtures" / "model"
PLANTED = "v_proj"


def _planted_candidate(out: Path) -> Path:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT / "fixtures"))
    from make_candidates import (  # the project's quantization code
        LINEARS,
        quant_int_sym,
    )

    from harness.engines.quant_weights import pack_codes

    out.mkdir(parents=True)
    tensors, layers = {}, []
    with safe_open(str(MODEL / "model.safetensors"), framework="pt") as fh:
        for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
            t = fh.get_tensor(key)
            prefix = key.removesuffix(".weight")
            kind = prefix.rsplit(".", 1)[-1]
            if key.endswith(".weight") and kind in LINEARS:
                bits = 3 if kind == PLANTED else 8
                q = quant_int_sym(t.double(), bits, 32)
                codes = q["codes"].long() - (1 << (bits - 1)) + 128  # value = code - 128 in the 8-bit container
                tensors[prefix + ".qweight"] = torch.from_numpy(pack_codes(codes.numpy().astype(np.uint8), 8))
                tensors[prefix + ".scales"] = q["scales"].reshape(t.shape[0], -1).to(torch.bfloat16).contiguous()
                layers.append(prefix)
            else:
                tensors[key] = t.contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(MODEL / "config.json", out / "config.json")
    meta = {"method": "rtn_sym_group_planted", "bits": 8, "group_size": 32, "code_kind": "int",
            "library": "harness-rtn", "simulated": False, "layers": sorted(layers)}
    (out / "quantization.json").write_text(json.dumps(meta), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory, once_per_session: Callable[[str, Callable[[], Any]], Any]) -> dict:
    def build() -> dict:
        import torch

        from harness.attribution.run import attribute, request_from

        torch.set_num_threads(2)
        cand = _planted_candidate(tmp_path_factory.mktemp("planted") / "cand")
        req = request_from(MODEL, cand, ROOT / "fixtures" / "suite", shards="0", by="kind", modes="restore",
                           n_boot=2000, progress=False)
        return attribute(req)

    return once_per_session("test_attribution-planted", build)


@pytest.fixture(scope="module")
def by_hand(planted: dict, once_per_session: Callable[[str, Callable[[], Any]], Any]) -> tuple[float, dict[str, float]]:
    """Whole KLD and per-kind ΔKLD (restore) of the planted candidate on shard 0, computed independently:
    full float64 forwards of the weight-swapped variants (fixtures/kld_by_hand.py)."""
    return once_per_session("test_attribution-by_hand", lambda: _by_hand(planted))


def _by_hand(planted: dict) -> tuple[float, dict[str, float]]:
    sys.path.insert(0, str(ROOT / "fixtures"))
    from kld_by_hand import ByHand

    from harness.inputs.suite import Suite

    suite = Suite.load(ROOT / "fixtures" / "suite")
    tokens = np.asarray(suite.tokens[suite.context_indices(suite.parse_shards("0"))])
    bh = ByHand(MODEL, Path(planted["candidate"]["path"]), tokens)
    (g,) = planted["groupings"]
    assert sorted(bh.differing()) == sorted(p for r in g["groups"] for p in r["params"])
    return bh.restore_effects({r["group"]: r["params"] for r in g["groups"]})


def _close(got: float, want: float, whole: float) -> bool:
    """The attribution's float32 compute against float64 forwards: within 1e-3 of the value + 1e-5 of the whole
    (measured: at most 5e-7 of the whole)."""
    return abs(got - want) <= 1e-3 * abs(want) + 1e-5 * whole


def test_planted_group_ranks_first(planted: dict, by_hand: tuple[float, dict[str, float]]) -> None:
    whole, effects = by_hand
    (g,) = planted["groupings"]
    assert [r["group"] for r in g["groups"]] == sorted(effects, key=lambda k: -effects[k])  # the by-hand order
    first = g["groups"][0]
    assert first["group"] == PLANTED and first["restore"]["ci95"][0] > 0
    assert g["bits_to_spend"][0]["group"] == PLANTED


def _tensor_bytes(path: Path) -> dict[str, int]:
    """Bytes of every tensor of a safetensors file, from its header read by hand (u64 length + JSON)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    return {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}


def test_effects_match_an_independent_computation(planted: dict, by_hand: tuple[float, dict[str, float]]) -> None:
    """Every ΔKLD, the whole and the interaction term against the float64 forwards; bytes and byte shares
    against the candidate file's header."""
    whole, effects = by_hand
    assert _close(planted["whole"]["value"], whole, whole), (planted["whole"]["value"], whole)
    (g,) = planted["groupings"]
    for r in g["groups"]:
        assert _close(r["restore"]["value"], effects[r["group"]], whole), (r["group"], r["restore"]["value"], effects[r["group"]])
    add = g["additivity"]
    assert _close(add["sum_restore"]["value"], sum(effects.values()), whole)
    assert _close(add["interaction_restore"]["value"], whole - sum(effects.values()), whole)
    sizes = _tensor_bytes(Path(planted["candidate"]["path"]) / "model.safetensors")
    total = sum(sizes.values())
    assert planted["candidate"]["stored_bytes"] == total
    for r in g["groups"]:
        modules = {p.removesuffix(".weight") for p in r["params"]}
        want = sum(b for k, b in sizes.items() if k.rsplit(".", 1)[0] in modules)
        assert r["bytes"] == want and r["byte_share"] == pytest.approx(want / total, rel=1e-12), r["group"]


def test_cli_writes_all_files(planted: dict, tmp_path: Path) -> None:
    from harness.attribution.render import write_attribution

    paths = write_attribution(planted, tmp_path)
    assert [p.name for p in paths] == ["attribution.json", "attribution.md", "attribution.png"]
    assert json.loads(paths[0].read_text())["groupings"][0]["groups"][0]["group"] == PLANTED
    assert "| 1 | v_proj |" in paths[1].read_text()
    assert paths[2].read_bytes()[:4] == b"\x89PNG"
    # the setting that makes KLD(candidate) differ from the ladder's number is stated next to it
    dtype = planted["compute"]["dtype"]
    assert f"nats ({dtype} forward of both models' stored weights in this process" in paths[1].read_text()
    assert ("leaves out" in paths[1].read_text()) == (dtype != "bfloat16")


def test_refuses_other_architecture(tmp_path: Path) -> None:
    from harness.attribution.ablation import load_models
    from harness.errors import VerificationError

    other = tmp_path / "other"
    shutil.copytree(MODEL, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VerificationError, match="num_hidden_layers"):
        load_models(MODEL, other)
