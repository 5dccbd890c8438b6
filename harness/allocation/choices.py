"""The choices a layout search picks from, and the tensor groups it assigns them to.

Reasoning: docs/allocation.md §"Choices and groups".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import FidelityError

FAMILIES = ("project", "gguf")
GROUPINGS = ("module", "block", "layer")
#: The linear modules of a decoder layer that a layout quantizes, attention first.
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
LINEARS = ATTN + MLP
_PROJECT_RE = re.compile(r"^int([2-8])(?:_g(\d+))?$")
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
#: ggml types a GGUF layout may choose (block-32 types: they fit rows of any multiple of 32).
GGUF_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
#: The choices a search offers when none are given, per family.
DEFAULT_CHOICES = {"project": "int3_g32,int4_g64,int4_g32,int5_g32,int8", "gguf": ",".join(GGUF_TYPES)}


@dataclass(frozen=True)
class ProjectScheme:
    """One choice of the project's format: ``bits`` and ``group_size`` (None: one scale per row)."""

    bits: int
    group_size: int | None

    @property
    def name(self) -> str:
        return f"int{self.bits}" + (f"_g{self.group_size}" if self.group_size else "")


def parse_project(name: str) -> ProjectScheme:
    """``int4_g32`` -> ProjectScheme(4, 32); ``int8`` -> ProjectScheme(8, None)."""
    m = _PROJECT_RE.match(name.strip())
    if not m:
        raise FidelityError(f"choice {name!r}: expected int<bits>_g<group> or int<bits> (bits 2..8), e.g. int4_g32")
    group = int(m.group(2)) if m.group(2) else None
    if group is not None and group <= 0:
        raise FidelityError(f"choice {name!r}: the group size must be positive")
    return ProjectScheme(int(m.group(1)), group)


def parse_choices(family: str, text: str | Sequence[str]) -> list[str]:
    """The family's choices, validated, in the order given (``"int3_g32,int4_g32,int8"``)."""
    items = [x.strip() for x in (text.split(",") if isinstance(text, str) else text) if x.strip()]
    if family not in FAMILIES:
        raise FidelityError(f"family {family!r}: expected one of {', '.join(FAMILIES)}")
    if len(items) < 2 or len(set(items)) != len(items):
        raise FidelityError(f"choices {items}: expected two or more distinct choices")
    if family == "project":
        return [parse_project(x).name for x in items]
    bad = [x for x in items if x.upper() not in GGUF_TYPES]
    if bad:
        raise FidelityError(f"GGUF choices {bad}: expected ggml types among {', '.join(GGUF_TYPES)}")
    return [x.upper() for x in items]


def parse_subset(family: str, text: str | Sequence[str], choices: Sequence[str]) -> list[str]:
    """One or more of ``choices`` (``--uniforms int4_g32``), in the family's spelling."""
    items = [x.strip() for x in (text.split(",") if isinstance(text, str) else text) if x.strip()]
    named = [x.upper() if family == "gguf" else parse_project(x).name for x in items]
    bad = [x for x in named if x not in choices]
    if not named or bad:
        raise FidelityError(f"{items}: expected one or more of the choices ({', '.join(choices)})")
    return named


@dataclass(frozen=True)
class Group:
    """A set of units that get one choice: ``name`` and the unit (module) paths, sorted."""

    name: str
    units: tuple[str, ...]


def layer_of(unit: str) -> int:
    m = _LAYER_RE.search(unit + ".")
    if not m:
        raise FidelityError(f"unit {unit!r} is not in a decoder layer (model.layers.N....)")
    return int(m.group(1))


def make_groups(units: Sequence[str], grouping: str) -> list[Group]:
    """The groups of ``grouping`` (docs/allocation.md §"Choices and groups"), in layer order; every unit in exactly one group."""
    if grouping not in GROUPINGS:
        raise FidelityError(f"grouping {grouping!r}: expected one of {', '.join(GROUPINGS)}")
    named: dict[str, list[str]] = {}
    order: dict[str, tuple[int, int, str]] = {}
    for u in units:
        kind = u.rsplit(".", 1)[-1]
        layer = layer_of(u)
        if grouping == "module":
            key, pos = u, LINEARS.index(kind) if kind in LINEARS else len(LINEARS)
        elif grouping == "block":
            block = "attn" if kind in ATTN else "mlp"
            key, pos = f"layer {layer} {block}", 0 if block == "attn" else 1
        else:
            key, pos = f"layer {layer}", 0
        named.setdefault(key, []).append(u)
        order[key] = (layer, pos, key)
    return [Group(k, tuple(sorted(v))) for k, v in sorted(named.items(), key=lambda kv: order[kv[0]])]
