"""Mixtures of experts (Qwen3.5-MoE family): fused 3-D expert tensors in this project's candidate format,
the attribution's MoE kinds, per-expert groups (slices of the fused tensors) and routing counts.

A tiny random ``Qwen3_5MoeForCausalLM`` is built in a temporary folder; every expected value is computed
here independently (numpy float64 round-to-nearest-even, torch's own top-k on the router logits).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.attribution.groups import NON_EXPERT, by_expert, by_kind, module_kind, split_unit
from harness.attribution.sizes import unit_bytes
from harness.engines.quant_weights import load_quantized

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
EXPERTS = 4


def _tiny_config() -> object:
    from transformers import Qwen3_5MoeTextConfig

    return Qwen3_5MoeTextConfig(
        vocab_size=4096, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, layer_types=["full_attention"] * 2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=EXPERTS, num_experts_per_tok=2,
        max_position_embeddings=64, tie_word_embeddings=True, attn_implementation="eager",
    )


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen3_5MoeForCausalLM

    torch.manual_seed(7)
    model = Qwen3_5MoeForCausalLM(_tiny_config()).to(torch.bfloat16)  # type: ignore[arg-type]
    out = tmp_path_factory.mktemp("moe") / "model"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def int4_body(tiny_moe: Path) -> Path:
    sys.path.insert(0, str(FIXTURES))
    from make_candidates import RECIPES, load_model_source, make_candidate
    from make_moe_candidates import is_body_matrix

    source = load_model_source(tiny_moe)
    return make_candidate("int4_g32", RECIPES["int4_g32"], source, model_dir=tiny_moe,
                          out_dir=tiny_moe.parent / "cands", select=is_body_matrix)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float64 -> nearest-even bf16 value (through torch's conversion), as float64."""
    return torch.from_numpy(np.asarray(x, dtype=np.float64)).float().to(torch.bfloat16).double().numpy()


def _rtn_int4_g32(w: np.ndarray) -> np.ndarray:
    """Symmetric int4 RTN in groups of 32 along the input dimension, in numpy float64."""
    g = w.reshape(w.shape[0], -1, 32)
    scale = _bf16(np.abs(g).max(axis=-1) / 7.0)
    safe = np.where(scale == 0, 1.0, scale)
    q = np.clip(np.round(g / safe[..., None]), -8, 7)  # np.round: half to even
    return (q * scale[..., None]).reshape(w.shape)


def test_fused_experts_quantized_expert_by_expert(tiny_moe: Path, int4_body: Path) -> None:
    """Each expert's [out, in] matrix of the fused 3-D tensors dequantizes to its own int4 g32 RTN,
    computed here per expert; the router and the shared expert are quantized the same way."""
    from transformers import AutoModelForCausalLM

    ref = {k: v.double().numpy() for k, v in AutoModelForCausalLM.from_pretrained(tiny_moe, dtype=torch.bfloat16).state_dict().items()}
    cand = {k: v.double().numpy() for k, v in load_quantized(int4_body).state_dict().items()}
    fused = [k for k in ref if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(fused) == 4 and all(ref[k].ndim == 3 and ref[k].shape[0] == EXPERTS for k in fused)
    for key in fused:
        for e in range(EXPERTS):
            expected = _bf16(_rtn_int4_g32(ref[key][e]))
            np.testing.assert_array_equal(cand[key][e], expected, err_msg=f"{key}[{e}]")
    for key in ("model.layers.0.mlp.gate.weight", "model.layers.1.mlp.shared_expert.up_proj.weight"):
        np.testing.assert_array_equal(cand[key], _bf16(_rtn_int4_g32(ref[key])), err_msg=key)
    for key in ("model.layers.0.input_layernorm.weight", "model.embed_tokens.weight"):
        np.testing.assert_array_equal(cand[key], ref[key])


def test_moe_kinds_and_expert_groups() -> None:
    params = [
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.gate.weight",
        "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj",
        "model.layers.0.mlp.shared_expert.up_proj.weight", "model.layers.0.mlp.shared_expert_gate.weight",
        "model.layers.1.mlp.experts.2.gate_proj.weight",
    ]
    assert [module_kind(p) for p in params] == [
        "q_proj", "router", "experts.gate_up_proj", "experts.down_proj", "shared_expert.up_proj",
        "shared_expert_gate", "experts.gate_proj",
    ]
    assert module_kind("model.layers.0.mlp.experts.down_proj[3]") == "experts.down_proj"
    assert split_unit("a.b[12]") == ("a.b", 12) and split_unit("a.b.weight") == ("a.b.weight", None)
    kinds = by_kind(params)
    assert kinds.partition and {g.name for g in kinds.groups} >= {"router", "experts.gate_up_proj", "shared_expert_gate"}
    g = by_expert(params, {params[2]: 2, params[3]: 2})
    names = [x.name for x in g.groups]
    assert names == ["layer 0 expert 0", "layer 0 expert 1", "layer 1 expert 2", NON_EXPERT]
    assert g.groups[1].params == ("model.layers.0.mlp.experts.down_proj[1]", "model.layers.0.mlp.experts.gate_up_proj[1]")
    assert g.groups[2].params == (params[6],)
    assert set(g.groups[3].params) == {params[0], params[1], params[4], params[5]}
    units = [u for grp in g.groups for u in grp.params]
    assert len(units) == len(set(units)) and g.partition


def test_unit_bytes_split_and_fused() -> None:
    p = "model.layers.0.mlp.experts.gate_up_proj"
    fused = {p + ".qweight": 800, p + ".scales": 80, "model.layers.0.mlp.gate.weight": 16}
    split = {f"model.layers.0.mlp.experts.{e}.{q}.weight": 100 for e in range(4) for q in ("gate_proj", "up_proj", "down_proj")}
    assert unit_bytes(fused, p, {p: 4}) == 880 and unit_bytes(fused, p + "[1]", {p: 4}) == 220
    assert unit_bytes(split, p, {p: 4}) == 800 and unit_bytes(split, p + "[3]", {p: 4}) == 200
    assert unit_bytes(fused, "model.layers.0.mlp.gate.weight", {}) == 16


def test_expert_slices_swap_and_routing_counts(tiny_moe: Path, int4_body: Path) -> None:
    """Restoring one expert's slice puts the reference's rows there and leaves the other experts quantized;
    the routing counts equal torch.topk over the router logits the model itself returns."""
    from harness.attribution.ablation import load_models, routing_counts

    models = load_models(tiny_moe, int4_body)
    p = "model.layers.1.mlp.experts.down_proj"
    assert p in models.params
    models.set_variant([f"{p}[2]", "model.layers.0.mlp.gate.weight"])
    live = dict(models.model.named_parameters())[p].detach()
    for e in range(EXPERTS):
        want = models.ref_values[p][e] if e == 2 else models.cand_values[p][e]
        assert torch.equal(live[e], want), e
    assert torch.equal(dict(models.model.named_parameters())["model.layers.0.mlp.gate.weight"],
                       models.ref_values["model.layers.0.mlp.gate.weight"])
    with pytest.raises(Exception, match="not a differing parameter"):
        models.set_variant([f"{p}[{EXPERTS}]"])
    models.set_variant(models.params)
    tokens = np.random.default_rng(0).integers(0, 256, size=(3, 20))
    counts = routing_counts(models, tokens)
    with torch.inference_mode():
        out = models.model(input_ids=torch.as_tensor(tokens), output_router_logits=True, use_cache=False)
    for layer, logits in enumerate(out.router_logits):
        picks = torch.topk(logits.float().reshape(3, 20, EXPERTS)[:, :-1], 2, dim=-1).indices.reshape(-1)
        np.testing.assert_array_equal(counts[layer], np.bincount(picks.numpy(), minlength=EXPERTS))
    assert sum(int(c.sum()) for c in counts.values()) == 2 * 2 * 3 * 19


def test_layers_names_router_experts_and_shared_expert(tiny_moe: Path, tmp_path: Path) -> None:
    """``fidelity layers`` on an experts-only candidate: the routed experts (fed the reference's input and
    routing) deviate, every other module -- router, shared expert, attention -- is exactly the reference's."""
    sys.path.insert(0, str(FIXTURES))
    from make_candidates import RECIPES, load_model_source, make_candidate
    from make_moe_candidates import is_routed_expert

    from harness.attribution.layers import layer_errors

    cand = make_candidate("int4_experts", RECIPES["int4_g32"], load_model_source(tiny_moe), model_dir=tiny_moe,
                          out_dir=tmp_path, select=is_routed_expert)
    suite = FIXTURES / "suite"
    r = layer_errors(tiny_moe, cand, suite, shards="0", contexts=2)
    kinds = {row["kind"] for row in r["modules"]}
    assert {"router", "experts", "shared_expert.up_proj", "shared_expert_gate", "q_proj"} <= kinds
    for row in r["modules"]:
        if row["kind"] == "experts":
            assert row["rel_frobenius"] > 0, row
        else:
            assert row["rel_frobenius"] == 0 and row["sqnr_db"] is None, row


@pytest.mark.slow
def test_attribution_ranks_the_fixture_experts_with_routing() -> None:
    """``--by expert`` on the embedded MoE's experts-only candidate (shard 0): 32 groups (4 layers x 8 experts),
    each with an interval and its routing share (a layer's shares add up to 1); an expert its router never
    picks on these positions cannot change the output, so its ΔKLD is exactly 0 -- whatever the ranking code
    does -- and every picked expert's restore moves the KLD."""
    sys.path.insert(0, str(FIXTURES))
    from make_moe_candidates import OUT_DIR, ensure

    from harness.attribution.run import attribute, request_from

    ensure()
    r = attribute(request_from(FIXTURES / "moe" / "model", OUT_DIR / "int4_experts", FIXTURES / "suite", shards="0",
                               by="expert", modes=("restore",), n_boot=1000, progress=False))
    (g,) = r["groupings"]
    rows = {row["group"]: row for row in g["groups"]}
    assert len(rows) == 32 and g["additivity"] is not None  # experts only: no group outside them
    for layer in range(4):
        shares = [rows[f"layer {layer} expert {e}"]["routing"]["share"] for e in range(8)]
        assert abs(sum(shares) - 1) < 1e-12
    values = [row["restore"]["value"] for row in g["groups"]]
    assert values == sorted(values, reverse=True) and [row["rank"] for row in g["groups"]] == list(range(1, 33))
    for row in g["groups"]:
        assert row["restore"]["ci95"] is not None
        if row["routing"]["picks"] == 0:
            assert row["restore"]["value"] == 0, row
        else:
            assert row["restore"]["value"] != 0, row
