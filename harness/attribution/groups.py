"""Tensor groups of an attribution: named sets of model parameters.

A *parameter* is a name of ``model.named_parameters()`` (e.g. ``model.layers.2.mlp.up_proj.weight``).
Only the parameters whose values differ between the reference and the candidate (the quantized
ones) are grouped; identical parameters cannot contribute drift.

Reasoning: docs/diagnostics.md §"Tensor groups".
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import FidelityError

GROUPINGS = ("layer", "kind", "expert")

#: What a module kind is, for reports: dense / full-attention Qwen names, and the gated delta-rule
#: linear-attention block of hybrid models (``Qwen3_5ForCausalLM``), with llama.cpp's GGUF tensor name.
KIND_ROLES: dict[str, str] = {
    "q_proj": "attention query (in gated full attention also the per-head output gate rows)",
    "k_proj": "attention key",
    "v_proj": "attention value",
    "o_proj": "attention output",
    "gate_proj": "MLP gate",
    "up_proj": "MLP up",
    "down_proj": "MLP down",
    "in_proj_qkv": "linear-attention q/k/v in-projection (GGUF attn_qkv)",
    "in_proj_z": "linear-attention output gate z (GGUF attn_gate)",
    "in_proj_b": "linear-attention write strength beta (GGUF ssm_beta)",
    "in_proj_a": "linear-attention decay input alpha (GGUF ssm_alpha)",
    "conv1d": "linear-attention short causal convolution (GGUF ssm_conv1d)",
    "out_proj": "linear-attention state output (GGUF ssm_out)",
    "A_log": "linear-attention per-head decay rate (GGUF ssm_a)",
    "dt_bias": "linear-attention decay time-step bias (GGUF ssm_dt)",
    "linear_attn.norm": "linear-attention gated RMSNorm (GGUF ssm_norm)",
}
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_UNIT_RE = re.compile(r"^(.+)\[(\d+)\]$")
_EXPERT_RE = re.compile(r"\.mlp\.experts\.(?:(\d+)\.)?(\w+?)(?:\.weight)?$")
_SHARED_RE = re.compile(r"\.mlp\.shared_expert\.(\w+)\.weight$")
#: The outside-the-experts group of the ``expert`` grouping.
NON_EXPERT = "outside the routed experts"


@dataclass(frozen=True)
class TensorGroup:
    """One group: ``name`` (unique within its grouping) and the parameter names it holds (sorted)."""

    name: str
    params: tuple[str, ...]


@dataclass(frozen=True)
class Grouping:
    """A set of groups made by one rule (``layer``, ``kind`` or ``glob``).

    ``partition`` is true when every differing parameter is in exactly one group (then the effects
    of the groups can be added up and compared with the whole).
    """

    rule: str
    groups: tuple[TensorGroup, ...]
    partition: bool


def module_of(param: str) -> str:
    """The module path of a parameter (``a.b.weight`` -> ``a.b``)."""
    return param.rsplit(".", 1)[0] if "." in param else param


def layer_index(name: str) -> int | None:
    """The decoder layer a parameter or module name lies in (``model.layers.2.mlp`` -> 2), else None."""
    m = _LAYER_RE.search(name + ".")
    return int(m.group(1)) if m else None


def split_unit(unit: str) -> tuple[str, int | None]:
    """``"p[3]"`` -> ``("p", 3)`` (expert 3 of the fused tensor ``p``); a whole parameter -> ``(p, None)``."""
    m = _UNIT_RE.match(unit)
    return (m.group(1), int(m.group(2))) if m else (unit, None)


def fused_experts(param: str) -> bool:
    """True for a fused routed-experts tensor (``...mlp.experts.gate_up_proj``: no ``.weight`` suffix)."""
    m = _EXPERT_RE.search(param)
    return bool(m) and m.group(1) is None and not param.endswith(".weight")  # type: ignore[union-attr]


def moe_kind(param: str) -> str | None:
    """The mixture-of-experts kind of a parameter or unit (docs/diagnostics.md §"Tensor groups"), or None for other modules."""
    name = split_unit(param)[0]
    if name.endswith(".mlp.shared_expert_gate.weight"):
        return "shared_expert_gate"
    if name.endswith(".mlp.gate.weight"):
        return "router"
    m = _SHARED_RE.search(name)
    if m:
        return f"shared_expert.{m.group(1)}"
    m = _EXPERT_RE.search(name)
    if m:
        return f"experts.{m.group(2)}"
    return None


def module_kind(param: str) -> str:
    """The module's own name (``model.layers.0.self_attn.q_proj.weight`` -> ``q_proj``); the kinds of
    :func:`moe_kind` for a mixture of experts' router, experts and shared expert; a parameter other than
    ``weight``/``bias`` is its own kind (``...linear_attn.A_log`` -> ``A_log``); the linear-attention
    block's norm is ``linear_attn.norm``."""
    moe = moe_kind(param)
    if moe:
        return moe
    leaf = param.rsplit(".", 1)[-1]
    if "." in param and leaf not in ("weight", "bias"):
        return leaf
    parts = module_of(param).rsplit(".", 2)
    if parts[-1] == "norm" and len(parts) > 1 and parts[-2] == "linear_attn":
        return "linear_attn.norm"
    return parts[-1]


def _layer_key(param: str) -> tuple[int, str]:
    m = _LAYER_RE.search(param)
    return (int(m.group(1)), f"layer {int(m.group(1))}") if m else (1 << 30, module_kind(param))


def _collect(names: dict[str, list[str]], order: dict[str, tuple[int, str]]) -> tuple[TensorGroup, ...]:
    return tuple(TensorGroup(n, tuple(sorted(ps))) for n, ps in sorted(names.items(), key=lambda kv: order[kv[0]]))


def by_layer(params: Sequence[str]) -> Grouping:
    """One group per decoder layer (see docs/diagnostics.md §"Tensor groups")."""
    names: dict[str, list[str]] = {}
    order: dict[str, tuple[int, str]] = {}
    for p in params:
        key = _layer_key(p)
        names.setdefault(key[1], []).append(p)
        order[key[1]] = key
    return Grouping("layer", _collect(names, order), True)


def by_kind(params: Sequence[str]) -> Grouping:
    """One group per module kind, in order of first appearance."""
    names: dict[str, list[str]] = {}
    order: dict[str, tuple[int, str]] = {}
    for p in params:
        k = module_kind(p)
        names.setdefault(k, []).append(p)
        order.setdefault(k, (len(order), k))
    return Grouping("kind", _collect(names, order), True)


def by_expert(params: Sequence[str], experts: dict[str, int]) -> Grouping:
    """One group per routed expert of each layer plus :data:`NON_EXPERT` (docs/diagnostics.md §"Tensor groups").

    ``experts`` gives the number of experts of every fused tensor among ``params`` (its first
    dimension); such a tensor contributes one unit ``p[e]`` to each expert's group.
    """
    names: dict[str, list[str]] = {}
    order: dict[str, tuple[int, str]] = {}

    def add(layer: int, expert: int, unit: str) -> None:
        name = f"layer {layer} expert {expert}"
        names.setdefault(name, []).append(unit)
        order[name] = (layer * 4096 + expert, name)

    for p in params:
        m, lm = _EXPERT_RE.search(p), _LAYER_RE.search(p)
        if m and lm and p in experts:
            for e in range(experts[p]):
                add(int(lm.group(1)), e, f"{p}[{e}]")
        elif m and lm and m.group(1) is not None:
            add(int(lm.group(1)), int(m.group(1)), p)
        else:
            names.setdefault(NON_EXPERT, []).append(p)
            order[NON_EXPERT] = (1 << 40, NON_EXPERT)
    if not any(n != NON_EXPERT for n in names):
        raise FidelityError("--by expert: none of the parameters that differ between reference and candidate is a "
                            f"routed expert (e.g. {', '.join(sorted(params)[:3])})")
    return Grouping("expert", _collect(names, order), True)


def by_globs(params: Sequence[str], patterns: Sequence[str]) -> Grouping:
    """One group per glob pattern; a pattern that matches no differing parameter is an error."""
    groups = []
    seen: dict[str, int] = {}
    for pat in patterns:
        hit = sorted(p for p in params if fnmatch.fnmatchcase(p, pat))
        if not hit:
            raise FidelityError(
                f"--glob {pat!r}: matches none of the {len(params)} parameters that differ between reference "
                f"and candidate (e.g. {', '.join(sorted(params)[:3])})"
            )
        groups.append(TensorGroup(pat, tuple(hit)))
        for p in hit:
            seen[p] = seen.get(p, 0) + 1
    partition = len(seen) == len(params) and all(v == 1 for v in seen.values())
    return Grouping("glob", tuple(groups), partition)


def make_groupings(params: Sequence[str], rules: Sequence[str], globs: Sequence[str] = (),
                   experts: dict[str, int] | None = None) -> list[Grouping]:
    """The groupings asked for: ``rules`` from :data:`GROUPINGS`, plus one glob grouping when ``globs`` is given
    (``experts``: the expert count of each fused expert tensor, for ``expert``)."""
    if not params:
        raise FidelityError("reference and candidate have identical weights: nothing to attribute")
    out = []
    for r in rules:
        if r == "layer":
            out.append(by_layer(params))
        elif r == "kind":
            out.append(by_kind(params))
        elif r == "expert":
            out.append(by_expert(params, experts or {}))
        else:
            raise FidelityError(f"unknown grouping {r!r}: choose from {', '.join(GROUPINGS)}")
    if globs:
        out.append(by_globs(params, globs))
    if not out:
        raise FidelityError("no grouping: pass --by layer,kind and/or --glob PATTERN")
    return out
