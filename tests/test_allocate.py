"""Layout search (``fidelity allocate``, ``harness/allocation/``): real quantization, real files, independent checks.

* the knapsack's optimum equals a brute force over every layout of small instances;
* uniform layouts built by the search's builder are the committed candidates byte for byte (those were written
  by ``fixtures/make_candidates.py`` with torch arithmetic), and every built layout's stored bytes equal the bytes
  the search predicted;
* a mixed ``quantization.json`` (``layer_schemes``) loads through the format's loader with each unit's recipe,
  and the weights the search measures with are exactly the weights the built candidate loads; bad
  ``layer_schemes`` are refused, naming the file;
* the search on the embedded model (4 groups, 3 choices, shard 0): its proposal is the brute-force optimum of its
  own measured effects, fits the budget, and its predicted and in-process numbers are consistent sums;
* GGUF: llama.cpp writes the type asked for each unit, a unit's bytes do not depend on the other units' types,
  and the data bytes equal the block arithmetic.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.allocation.choices import make_groups, parse_choices, parse_project, parse_subset
from harness.allocation.family import ProjectFamily, layout_bytes
from harness.allocation.knapsack import solve
from harness.errors import FidelityError, VerificationError

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "fixtures" / "model"
CANDIDATES = ROOT / "fixtures" / "candidates"
BF16_GGUF = ROOT / "fixtures" / "gguf" / "fixture-bf16.gguf"


def test_knapsack_is_the_brute_force_optimum() -> None:
    rng = random.Random(7)
    for _ in range(150):
        groups = rng.randint(1, 5)
        costs = [[rng.randint(1, 30) for _ in range(rng.randint(1, 4))] for _ in range(groups)]
        values = [[rng.uniform(-1.0, 1.0) for _ in c] for c in costs]
        budget = rng.randint(sum(min(c) for c in costs), sum(max(c) for c in costs))
        feasible = [p for p in itertools.product(*(range(len(c)) for c in costs))
                    if sum(costs[g][o] for g, o in enumerate(p)) <= budget]
        best = min(sum(values[g][o] for g, o in enumerate(p)) for p in feasible)
        picks = solve(costs, values, budget)
        assert sum(costs[g][o] for g, o in enumerate(picks)) <= budget
        assert abs(sum(values[g][o] for g, o in enumerate(picks)) - best) < 1e-9
    with pytest.raises(FidelityError, match="no layout fits"):
        solve([[5, 6]], [[0.0, -1.0]], 4)


def test_choices_and_groups() -> None:
    assert parse_project("int4_g32").name == "int4_g32" and parse_project("int8").group_size is None
    assert parse_choices("gguf", "q4_0, Q8_0") == ["Q4_0", "Q8_0"]
    for bad in ("int9_g32", "fp4", "int4_g"):
        with pytest.raises(FidelityError, match="expected int<bits>"):
            parse_project(bad)
    with pytest.raises(FidelityError, match="ggml types"):
        parse_choices("gguf", "Q4_K,Q8_0")
    assert parse_subset("project", "int4_g32", ["int3_g32", "int4_g32"]) == ["int4_g32"]
    assert parse_subset("gguf", "q5_0", ["Q5_0", "Q8_0"]) == ["Q5_0"]
    with pytest.raises(FidelityError, match="one or more of the choices"):
        parse_subset("project", "int5_g32", ["int3_g32", "int4_g32"])
    units = [f"model.layers.{i}.{b}" for i in range(2) for b in ("self_attn.q_proj", "mlp.up_proj", "self_attn.o_proj")]
    blocks = make_groups(units, "block")
    assert [g.name for g in blocks] == ["layer 0 attn", "layer 0 mlp", "layer 1 attn", "layer 1 mlp"]
    assert sorted(u for g in blocks for u in g.units) == sorted(units)
    assert len(make_groups(units, "module")) == 6 and len(make_groups(units, "layer")) == 2


@pytest.fixture(scope="module")
def family() -> ProjectFamily:
    return ProjectFamily(MODEL, ["int3_g32", "int4_g32", "int5_g32", "int8"])


@pytest.mark.parametrize("choice", ["int4_g32", "int8"])
def test_uniform_build_is_the_committed_candidate(family: ProjectFamily, choice: str, tmp_path: Path) -> None:
    from harness.attribution.sizes import folder_tensor_bytes

    out = family.build({u: choice for u in family.units}, tmp_path / choice)
    committed = CANDIDATES / choice
    assert (out / "model.safetensors").read_bytes() == (committed / "model.safetensors").read_bytes()
    predicted = layout_bytes(family, {u: choice for u in family.units})
    assert sum(folder_tensor_bytes(out).values()) == predicted == sum(folder_tensor_bytes(committed).values())
    q = json.loads((out / "quantization.json").read_text())
    assert "layer_schemes" not in q and q["on_disk_bytes"] == json.loads((committed / "quantization.json").read_text())["on_disk_bytes"]


def test_mixed_layout_loads_with_each_units_recipe(family: ProjectFamily, tmp_path: Path) -> None:
    from harness.attribution.sizes import folder_tensor_bytes
    from harness.engines.identity import model_identity
    from harness.engines.quant_weights import load_quantized

    rng = random.Random(3)
    layout = {u: rng.choice(family.choices) for u in family.units}
    out = family.build(layout, tmp_path / "mixed")
    assert sum(folder_tensor_bytes(out).values()) == layout_bytes(family, layout)
    q = json.loads((out / "quantization.json").read_text())
    base = parse_project(f"int{q['bits']}" + (f"_g{q['group_size']}" if q["group_size"] else "")).name
    assert {u for u, c in layout.items() if c != base} == set(q["layer_schemes"])
    model = load_quantized(out, dtype=torch.bfloat16)
    params = dict(model.named_parameters())
    with torch.no_grad():
        ref = {u: family.source[u + ".weight"].double().numpy() for u in family.units}
    for u, c in layout.items():
        loaded = params[u + ".weight"].detach().float().numpy()
        assert np.array_equal(loaded, family.weight(u, c)), u  # what the search measures is what the candidate loads
        s = parse_project(c)
        g = s.group_size or ref[u].shape[1]
        qmax = (1 << (s.bits - 1)) - 1
        absmax = np.abs(ref[u].reshape(ref[u].shape[0], -1, g)).max(-1)
        step = np.repeat(absmax / qmax, g, axis=1) * (1 + 2.0**-7)  # the bf16 scale may round up by half an ulp
        # round-to-nearest: within half a step, plus the bf16 rounding of the dequantized value
        assert np.all(np.abs(loaded - ref[u]) <= step / 2 + np.abs(ref[u]) * 2.0**-8 + 1e-12), u
    assert model_identity(out)["quantization"]["layer_schemes"] == q["layer_schemes"]


def test_layer_schemes_are_verified(tmp_path: Path, family: ProjectFamily) -> None:
    from harness.engines.quant_manifest import read_quant

    out = family.build({u: "int4_g32" for u in family.units}, tmp_path / "c")
    qpath = out / "quantization.json"
    good = json.loads(qpath.read_text())
    unit = family.units[0]
    cases = [({"model.layers.9.mlp.up_proj": {"bits": 4, "group_size": 32}}, "a layer listed in 'layers'"),
             ({unit: {"bits": 9, "group_size": 32}}, r"an integer in \[2, 8\]"),
             ({unit: {"bits": 4}}, "keys bits, group_size"),
             ({unit: {"bits": 4, "group_size": 0}}, "a positive integer or null"),
             ([unit], "an object")]
    for schemes, message in cases:
        qpath.write_text(json.dumps({**good, "layer_schemes": schemes}))
        with pytest.raises(VerificationError, match=message) as err:
            read_quant(out)
        assert "quantization.json" in str(err.value)


def test_recipe_names_every_unit_once(family: ProjectFamily) -> None:
    import yaml

    from harness.allocation.outputs import llmcompressor_recipe

    layout = {u: ("int8" if i % 3 == 0 else "int3_g32" if i % 3 == 1 else "int4_g32") for i, u in enumerate(family.units)}
    doc = yaml.safe_load(llmcompressor_recipe(layout))
    groups = doc["default_stage"]["default_modifiers"]["QuantizationModifier"]["config_groups"]
    import re

    seen = {}
    for g in groups.values():
        for t in g["targets"]:
            hit = [u for u in family.units if re.search(t.removeprefix("re:"), u)]
            assert len(hit) == 1
            seen[hit[0]] = g["weights"]
    assert set(seen) == set(family.units)
    for u, w in seen.items():
        s = parse_project(layout[u])
        assert w["num_bits"] == s.bits and w.get("group_size") == s.group_size
        assert w["strategy"] == ("group" if s.group_size else "channel") and w["symmetric"] is True


def _undeclared(value: object, record: object, where: str = "") -> list[str]:
    """The keys of ``value`` (JSON) that the type ``record`` does not declare, recursively (dotted paths)."""
    import types
    import typing

    if typing.is_typeddict(record) and isinstance(value, dict):
        hints = typing.get_type_hints(record)
        out = [f"{where}.{k}" for k in value if k not in hints]
        for k, v in value.items():
            out += _undeclared(v, hints[k], f"{where}.{k}") if k in hints else []
        return out
    origin, args = typing.get_origin(record), typing.get_args(record)
    if origin is list and isinstance(value, list):
        return [x for i, v in enumerate(value) for x in _undeclared(v, args[0], f"{where}[{i}]")]
    if origin is dict and isinstance(value, dict):
        return [x for k, v in value.items() for x in _undeclared(v, args[1], f"{where}.{k}")]
    if origin in (typing.Union, types.UnionType) and value is not None:
        (inner,) = [a for a in args if a is not type(None)]
        return _undeclared(value, inner, where)
    return []


def test_the_undeclared_key_walk_sees_nested_keys() -> None:
    from harness.allocation.records import GroupRecord, ProxyRecord

    proxy = {"definition": "d", "contexts": 1, "scale_nats_per_unit": 0.0, "rank_agreement": {"n": 0, "rho": 1}}
    assert _undeclared(proxy, ProxyRecord) == [".rank_agreement.rho"]
    assert _undeclared([{"name": "g", "units": [], "x": 1}], list[GroupRecord]) == ["[0].x"]


@pytest.mark.slow
def test_search_proposes_its_own_optimum(family: ProjectFamily, tmp_path: Path) -> None:
    """The search on the embedded model, by layer (4 groups x 3 choices, shard 0, ~20 s); ``allocation.json`` is
    exactly its declared record (:class:`harness.allocation.records.AllocationDoc`), checked when read back."""
    from harness.allocation.plan import AllocationRequest, allocate

    torch.set_num_threads(1)
    fam = ProjectFamily(MODEL, ["int3_g32", "int4_g32", "int5_g32"])
    r = allocate(AllocationRequest(MODEL, ROOT / "fixtures" / "suite", fam, "int4_g32", ("int4_g32",), grouping="layer",
                                   shards="0", n_boot=1000, progress=False))
    assert len(r["effects"]) == 8 and r["variants_scored"] == 10
    eff = {(e["group"], e["choice"]): e for e in r["effects"]}
    # every int3 downgrade costs KLD and every int5 upgrade buys some, each with an interval off zero
    for (g, c), e in eff.items():
        assert e["delta_kld"]["excludes_zero"] and (e["delta_kld"]["value"] > 0) == (c == "int3_g32"), (g, c)
    (p,) = r["proposals"]
    groups = [g["name"] for g in r["groups"]]
    units = {g["name"]: g["units"] for g in r["groups"]}
    best = None
    for picks in itertools.product(["int4_g32", "int3_g32", "int5_g32"], repeat=len(groups)):
        layout = {u: c for g, c in zip(groups, picks) for u in units[g]}
        if layout_bytes(fam, layout) > p["budget_bytes"]:
            continue
        value = sum(eff[(g, c)]["delta_kld"]["value"] for g, c in zip(groups, picks) if c != "int4_g32")
        best = value if best is None else min(best, value)
    # at int4's bytes, int3 somewhere pays for int5 elsewhere: the optimum gains
    assert best is not None and abs(p["objective"] - best) < 1e-12 and best < 0
    assert p["predicted_bytes"] <= p["budget_bytes"] == layout_bytes(fam, {u: "int4_g32" for u in fam.units})
    assert abs(p["predicted_delta_kld"]["value"] - p["objective"]) < 1e-12
    assert abs(p["predicted_kld"]["value"] - (r["base"]["kld"]["value"] + p["objective"])) < 1e-12
    assert abs(p["in_process_kld"]["value"] - p["predicted_kld"]["value"] - p["interaction"]["value"]) < 1e-12
    # the in-process base is the committed int4_g32 (its shard-0 KLD through the ladder: 7.30e-3, bf16 compute)
    assert 6.5e-3 < r["base"]["kld"]["value"] < 8.0e-3
    ra = r["proxy"]["rank_agreement"]
    from scipy.stats import spearmanr

    assert ra["n"] == 8 and abs(ra["spearman"] - spearmanr([e["proxy"] for e in r["effects"]],
                                                            [e["delta_kld"]["value"] for e in r["effects"]]).statistic) < 1e-12

    from harness.allocation.records import AllocationDoc
    from harness.allocation.render import write_allocation
    from harness.io.jsonio import read_json
    from harness.io.schema import check, schema_of

    write_allocation(r, tmp_path)
    path = tmp_path / "allocation.json"
    doc = read_json(path)
    check(doc, schema_of(AllocationDoc), path)  # every declared key present, with its type
    assert _undeclared(doc, AllocationDoc) == []  # and nothing undeclared
    del doc["proposals"][0]["interaction"]["ci95"]
    with pytest.raises(VerificationError, match=r"allocation.json: proposals\[0\]\.interaction\.ci95: expected present, found missing"):
        check(doc, schema_of(AllocationDoc), path)


def _gguf_ready() -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install llama-cpp-python==0.3.36)")
    pytest.importorskip("gguf", reason="gguf not installed (pip install 'fidelity-harness[gguf]')")


def test_gguf_overrides_write_the_types_asked(tmp_path: Path) -> None:
    _gguf_ready()
    import gguf

    from harness.allocation.family import GgufFamily
    from harness.allocation.gguf_format import gguf_name, tensor_type_lines, types_and_bytes

    def type_bytes(name: str, shape: tuple[int, int]) -> int:
        """Data bytes of a ``[out, in]`` tensor of ggml type ``name`` (gguf's own block table): rows of
        ``in / block`` blocks."""
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name.upper()]]
        assert shape[1] % block == 0
        return int(shape[0] * (shape[1] // block) * size)


    fam = GgufFamily(MODEL, BF16_GGUF, ["Q4_0", "Q8_0"], tmp_path / "work")
    layout = {u: ("Q8_0" if ".layers.0." in u or u.endswith("down_proj") else "Q4_0") for u in fam.units}
    path = fam.build(layout, tmp_path / "mixed")
    types, nbytes = types_and_bytes(path)
    uni_types, uni_bytes = types_and_bytes(tmp_path / "work" / "uniform-q4_0.gguf")
    for u, t in layout.items():
        n = gguf_name(u)
        shape = tuple(int(x) for x in fam.weight(u, t).shape)
        assert types[n] == t and nbytes[n] == type_bytes(t, (shape[0], shape[1])) == fam.unit_bytes(u, t)
        if t == "Q4_0":  # a unit's bytes do not depend on the others' types
            assert uni_types[n] == "Q4_0" and uni_bytes[n] == nbytes[n]
    assert types["token_embd.weight"] == "Q8_0"
    assert fam.built_bytes(path) == layout_bytes(fam, layout)
    lines = tensor_type_lines(layout, "Q8_0")
    assert len(lines) == len(layout) + 1 and "--tensor-type '^blk\\.0\\.attn_q\\.weight$=q8_0'" in lines


def _check(diff: float, lo: float, hi: float) -> dict[str, object]:
    return {"proposals": [{"candidate": "alloc-x", "on_disk_bytes": 100, "measured_kld": {"value": 1.0},
                           "comparator": {"candidate": "uniform-x", "on_disk_bytes": 100, "measured_kld": {"value": 1.0},
                                          "paired": {"diff": diff, "ci95": [lo, hi]}}}]}


def test_marker_fails_a_worse_proposal() -> None:
    from harness.plugin.kind_allocate import verdict_problems

    assert verdict_problems(_check(-0.2, -0.3, -0.1), "better") == []
    assert verdict_problems(_check(0.0, -0.1, 0.1), None) == []  # not worse: passes without expect
    assert "not shown better" in verdict_problems(_check(0.0, -0.1, 0.1), "better")[0]
    assert "the proposal is worse" in verdict_problems(_check(0.2, 0.1, 0.3), None)[0]
    assert "no uniform layout" in verdict_problems({"proposals": [{"candidate": "alloc-y"}]}, None)[0]


def test_a_budget_below_the_smallest_layout_is_refused_before_measuring(family: ProjectFamily) -> None:
    from harness.allocation.plan import AllocationRequest, allocate

    smallest = layout_bytes(family, {u: "int3_g32" for u in family.units})
    req = AllocationRequest(MODEL, ROOT / "fixtures" / "suite", family, "int4_g32", (str(smallest - 1),), progress=False)
    with pytest.raises(FidelityError, match=f"the smallest layout of these choices takes {smallest} bytes"):
        allocate(req)
