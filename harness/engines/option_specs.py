"""Per-engine options: what a candidate's ``[candidates.options]`` table may say, checked on load.

Reasoning: docs/engines.md §"Engine options".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from harness.errors import FidelityError

__all__ = ["OptionSpec", "describe_options", "validate_options"]

#: Option kinds: the TOML value types each accepts.
KINDS = ("int", "float", "bool", "str", "str|table", "table")


@dataclass(frozen=True)
class OptionSpec:
    """One engine option."""

    #: One of :data:`KINDS`: ``int``, ``float``, ``bool``, ``str``, ``str|table`` (a string or a table), ``table``.
    kind: str
    #: What it does, shown in errors and ``fidelity capture --help``.
    doc: str
    #: Smallest (int/float) value allowed, inclusive; None: no lower bound.
    minimum: float | None = None
    #: Largest (int/float) value allowed, inclusive; None: no upper bound.
    maximum: float | None = None
    #: Allowed strings (``str`` and the string form of ``str|table``); empty: any string.
    choices: tuple[str, ...] = ()


_D = TypeVar("_D")


def int_option(options: Mapping[str, object], key: str, default: _D) -> int | _D:
    """A validated integer option (``default`` when absent); anything else is a FidelityError naming it."""
    value = options.get(key, default)
    if value is default:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise FidelityError(f"engine option {key!r}: expected an integer, found {value!r}")
    return value


def table_option(options: Mapping[str, object], key: str) -> dict[str, object]:
    """A validated table option (empty when absent); anything else is a FidelityError naming it."""
    value = options.get(key, {})
    if not isinstance(value, dict):
        raise FidelityError(f"engine option {key!r}: expected a table, found {value!r}")
    return {str(k): v for k, v in value.items()}


def describe_options(specs: Mapping[str, OptionSpec]) -> str:
    """``name (kind)`` for every option, comma-separated (for error messages and help)."""
    return ", ".join(f"{k} ({v.kind})" for k, v in sorted(specs.items())) or "none"


def _check_table(engine: str, key: str, value: object) -> dict[str, str | int | float]:
    if not isinstance(value, dict):
        raise FidelityError(f"engine {engine!r} option {key!r}: expected a table, found {type(value).__name__} {value!r}")
    for k, v in value.items():
        if not isinstance(v, (str, int, float)) or isinstance(v, bool) or (isinstance(v, float) and not math.isfinite(v)):
            raise FidelityError(f"engine {engine!r} option {key}.{k}: expected a string or a finite number, found {v!r}")
    return dict(sorted(value.items()))


def _check_one(engine: str, key: str, spec: OptionSpec, value: object) -> bool | int | float | str | dict[str, str | int | float]:
    where = f"engine {engine!r} option {key!r}"
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise FidelityError(f"{where}: expected true or false, found {value!r}")
        return value
    if spec.kind in ("int", "float"):
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or (spec.kind == "int" and not isinstance(value, int))
                or (isinstance(value, float) and not math.isfinite(value))):
            raise FidelityError(f"{where}: expected {'an integer' if spec.kind == 'int' else 'a finite number'}, found {value!r}")
        if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
            lo = "-inf" if spec.minimum is None else f"{spec.minimum:g}"
            hi = "inf" if spec.maximum is None else f"{spec.maximum:g}"
            raise FidelityError(f"{where}: expected a value in [{lo}, {hi}], found {value!r}")
        return value if spec.kind == "int" else float(value)
    if spec.kind == "table":
        return _check_table(engine, key, value)
    if spec.kind == "str|table" and isinstance(value, dict):
        return _check_table(engine, key, value)
    if not isinstance(value, str):
        raise FidelityError(f"{where}: expected a string{' or a table' if spec.kind == 'str|table' else ''}, found {value!r}")
    if spec.choices and value not in spec.choices:
        raise FidelityError(f"{where}: expected one of {', '.join(spec.choices)}, found {value!r}")
    return value


def validate_options(engine: str, specs: Mapping[str, OptionSpec], raw: object) -> dict[str, object]:
    """The options of ``raw`` checked against ``specs`` (sorted by name); a FidelityError names the problem."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise FidelityError(f"engine {engine!r} options: expected a table, found {type(raw).__name__}")
    out: dict[str, object] = {}
    for key in sorted(raw):
        if key not in specs:
            import difflib

            close = difflib.get_close_matches(str(key), list(specs), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise FidelityError(f"engine {engine!r} has no option {key!r}{hint}; its options are: {describe_options(specs)}")
        out[key] = _check_one(engine, key, specs[key], raw[key])
    return out
