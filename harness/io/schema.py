"""Schemas for the JSON files the harness reads: one declaration per file, checked by :func:`check`.

Reasoning: docs/design.md §"Schemas of the files read".
"""

from __future__ import annotations

import json
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints, is_typeddict

from harness.errors import VerificationError
from harness.io.jsonio import type_name


@dataclass(frozen=True)
class Optional:
    """A key that may be absent (when present it must match ``schema``)."""

    schema: Any


@dataclass(frozen=True)
class Nullable:
    """``null`` or a value matching ``schema``."""

    schema: Any


@dataclass(frozen=True)
class MapOf:
    """An object of any keys whose every value matches ``schema``."""

    schema: Any


@dataclass(frozen=True)
class Closed:
    """An object holding the keys of ``schema`` (a dict schema) and no other key."""

    schema: dict[str, Any]


class OneOf:
    """Exactly one of ``values`` (compared by JSON type and value: ``1`` is not ``true`` nor ``1.0``)."""

    def __init__(self, *values: Any) -> None:
        self.values = values

    def accepts(self, value: Any) -> bool:
        return any(type(value) is type(v) and value == v for v in self.values)


_NAMES = {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}


def describe(schema: Any) -> str:
    """A short description of what ``schema`` expects (for messages)."""
    if isinstance(schema, type) and schema in _NAMES:
        return _NAMES[schema]
    if isinstance(schema, dict):
        return "an object {" + ", ".join(schema) + "}"
    if isinstance(schema, list):
        return f"an array of {describe(schema[0])}"
    if isinstance(schema, MapOf):
        return f"an object of {describe(schema.schema)}"
    if isinstance(schema, Nullable):
        return f"null or {describe(schema.schema)}"
    if isinstance(schema, Closed):
        return "an object {" + ", ".join(schema.schema) + "} (no other key)"
    if isinstance(schema, OneOf):
        return " or ".join(json.dumps(v) for v in schema.values)
    return "a value"


def _found(value: Any) -> str:
    text = repr(value)
    return f"{type_name(value)} {text if len(text) <= 60 else text[:57] + '...'}"


def check(value: Any, schema: Any, path: str | Path, where: str = "") -> None:
    """Refuse ``value`` unless it matches ``schema`` (docs/design.md §"Schemas of the files read"); ``where`` is its dotted key."""
    at = where or "top level"
    if schema is object:
        return
    if isinstance(schema, Nullable):
        if value is not None:
            try:
                check(value, schema.schema, path, where)
            except VerificationError as e:
                if e.what != at:  # deeper inside: that key's own message
                    raise
                raise VerificationError(path, at, describe(schema), _found(value)) from None
        return
    if schema is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise VerificationError(path, at, "an integer", _found(value))
        return
    if schema is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise VerificationError(path, at, "a finite number", _found(value))
        return
    if schema is str or schema is bool:
        if not isinstance(value, schema):
            raise VerificationError(path, at, _NAMES[schema], _found(value))
        return
    if isinstance(schema, list):
        if not isinstance(value, list):
            raise VerificationError(path, at, describe(schema), _found(value))
        for i, item in enumerate(value):
            check(item, schema[0], path, f"{where}[{i}]")
        return
    if isinstance(schema, MapOf):
        if not isinstance(value, dict):
            raise VerificationError(path, at, describe(schema), _found(value))
        for k, v in value.items():
            check(v, schema.schema, path, f"{where}.{k}" if where else str(k))
        return
    if isinstance(schema, OneOf):
        if not schema.accepts(value):
            raise VerificationError(path, at, describe(schema), _found(value))
        return
    if isinstance(schema, Closed):
        if not isinstance(value, dict):
            raise VerificationError(path, at, describe(schema), _found(value))
        unknown = sorted(set(value) - set(schema.schema))
        if unknown:
            where_key = f"{where}.{unknown[0]}" if where else unknown[0]
            raise VerificationError(path, where_key, f"no such key (known: {', '.join(schema.schema)})", "present")
        check(value, schema.schema, path, where)
        return
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise VerificationError(path, at, describe(schema), _found(value))
        for key, sub in schema.items():
            inner = f"{where}.{key}" if where else key
            if key not in value:
                if isinstance(sub, Optional):
                    continue
                raise VerificationError(path, inner, "present", "missing")
            check(value[key], sub.schema if isinstance(sub, Optional) else sub, path, inner)
        return
    raise TypeError(f"not a schema: {schema!r}")  # a programming error, never a file's


def schema_of(record: object) -> Any:
    """The schema (docs/design.md §"Schemas of the files read") of a type as a record declares it: a ``TypedDict`` is an object with its
    required keys and its ``NotRequired`` keys as :class:`Optional` (other keys allowed), each checked
    recursively; ``int``, ``float``, ``str``, ``bool`` are themselves; ``list[X]`` is ``[X]``;
    ``dict[str, X]`` is :class:`MapOf`; ``X | None`` is :class:`Nullable`; ``Literal[...]`` is
    :class:`OneOf`; a union of other types, ``object`` and ``Any`` accept anything."""
    if record in (int, float, str, bool):
        return record
    if record is object or record is Any:
        return object
    if record is dict:  # a JSON object whose own reader checks it
        return MapOf(object)
    if is_typeddict(record):
        # NotRequired is kept in the hints (include_extras): under postponed annotations the class's own
        # __optional_keys__ cannot see it
        hints = get_type_hints(record, include_extras=True)
        optional = set(getattr(record, "__optional_keys__", frozenset()))
        optional |= {key for key, tp in hints.items() if get_origin(tp) is typing.NotRequired}
        return {key: Optional(schema_of(tp)) if key in optional else schema_of(tp) for key, tp in hints.items()}
    origin, args = get_origin(record), get_args(record)
    if origin is list:
        return [schema_of(args[0])]
    if origin is dict:
        return MapOf(schema_of(args[1]))
    if origin is Literal:
        return OneOf(*args)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        nullable = len(inner) < len(args)
        one = schema_of(inner[0]) if len(inner) == 1 else object
        return Nullable(one) if nullable else one
    if origin in (typing.NotRequired, typing.Required):
        return schema_of(args[0])
    raise TypeError(f"no schema for {record!r}")  # a programming error, never a file's


_R = TypeVar("_R")
_SCHEMAS: dict[object, Any] = {}


def checked(value: object, record: type[_R], path: str | Path, where: str = "") -> _R:
    """``value`` (a JSON document as read) as the ``TypedDict`` ``record``, once it matches the record's own
    schema (:func:`schema_of`, checked by :func:`check`): the one place where a document read from disk becomes
    a typed record (a mismatch is a :class:`~harness.errors.VerificationError` naming ``path`` and the key)."""
    schema = _SCHEMAS.get(record)
    if schema is None:
        schema = _SCHEMAS[record] = schema_of(record)
    check(value, schema, path, where)
    return cast("_R", value)
