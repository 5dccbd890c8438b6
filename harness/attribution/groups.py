"""Tensor groups of an attribution: named sets of model parameters.

A *parameter* is a name of ``model.named_parameters()`` (e.g. ``model.layers.2.mlp.up_proj.weight``).
Only the parameters whose values differ between the reference and the candidate (the quantized
ones) are grouped; identical parameters cannot contribute drift.

Groupings:

* ``layer`` -- one group per decoder layer (``layer 2`` holds every differing parameter whose name
  contains ``.layers.2.``); a differing parameter outside the layers (embedding, final norm, LM head)
  forms its own group named after its module (``embed_tokens``).
* ``kind`` -- one group per module kind, the module's own name (``q_proj``, ``k_proj``, ``v_proj``,
  ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``; ``embed_tokens``, ``norm`` ...).
* globs -- one group per user pattern (:func:`fnmatch.fnmatchcase` on the parameter name; the
  pattern is the group's name). Globs may overlap and may leave parameters out.

``layer`` and ``kind`` are *partitions*: every differing parameter is in exactly one group, so the
group effects can be compared with the whole (see :mod:`harness.attribution.effects`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import FidelityError

GROUPINGS = ("layer", "kind")
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


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


def module_kind(param: str) -> str:
    """The module's own name (``model.layers.0.self_attn.q_proj.weight`` -> ``q_proj``)."""
    return module_of(param).rsplit(".", 1)[-1]


def _layer_key(param: str) -> tuple[int, str]:
    m = _LAYER_RE.search(param)
    return (int(m.group(1)), f"layer {int(m.group(1))}") if m else (1 << 30, module_kind(param))


def _collect(names: dict[str, list[str]], order: dict[str, tuple[int, str]]) -> tuple[TensorGroup, ...]:
    return tuple(TensorGroup(n, tuple(sorted(ps))) for n, ps in sorted(names.items(), key=lambda kv: order[kv[0]]))


def by_layer(params: Sequence[str]) -> Grouping:
    """One group per decoder layer (see the module docstring)."""
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


def make_groupings(params: Sequence[str], rules: Sequence[str], globs: Sequence[str] = ()) -> list[Grouping]:
    """The groupings asked for: ``rules`` from :data:`GROUPINGS`, plus one glob grouping when ``globs`` is given."""
    if not params:
        raise FidelityError("reference and candidate have identical weights: nothing to attribute")
    out = []
    for r in rules:
        if r == "layer":
            out.append(by_layer(params))
        elif r == "kind":
            out.append(by_kind(params))
        else:
            raise FidelityError(f"unknown grouping {r!r}: choose from {', '.join(GROUPINGS)}")
    if globs:
        out.append(by_globs(params, globs))
    if not out:
        raise FidelityError("no grouping: pass --by layer,kind and/or --glob PATTERN")
    return out
