"""The one strict JSON reader: every JSON file the harness reads goes through :func:`read_json`.

A file is refused (:class:`~harness.errors.VerificationError` naming the file, and the key where
there is one) when it

* is missing or unreadable, or not UTF-8;
* is not JSON, or is nested deeper than Python's recursion limit;
* lists one key twice in an object (the standard library would keep the last one silently);
* contains ``NaN``, ``Infinity``, ``-Infinity`` or a number that overflows a float (``1e999``);
* has a top level of another type than asked for (``expect``).

The typed accessors (:func:`get_str`, :func:`get_int`, :func:`get_list`) refuse a field of the wrong type with the file and the key.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeAlias

from harness.errors import VerificationError

#: A JSON value as the reader returns it (an object's keys are strings).
JSON: TypeAlias = "None | bool | int | float | str | list[JSON] | dict[str, JSON]"
#: A JSON object: the identities, manifests and records the harness writes and reads back.
JSONObject: TypeAlias = "dict[str, JSON]"

#: JSON type names used in messages, by Python type.
_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number", bool: "true/false"}


def type_name(value: Any) -> str:
    """The JSON name of ``value``'s type, for messages."""
    if value is None:
        return "null"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _pairs_hook(path: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise VerificationError(path, f"JSON key {key!r}", "each key once", "listed twice")
            out[key] = value
        return out

    return hook


def _constant_hook(path: str) -> Any:
    def reject(name: str) -> Any:
        raise VerificationError(path, "number", "finite JSON numbers", name)

    return reject


def _float_hook(path: str) -> Any:
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise VerificationError(path, "number", "finite JSON numbers", f"{text} (overflows a float)")
        return value

    return parse


def loads_json(text: str, path: str | Path, *, expect: type | None = dict) -> Any:
    """Parse ``text`` (the content of ``path``) strictly; ``expect`` is the required top-level type."""
    where = str(path)
    try:
        doc = json.loads(text, object_pairs_hook=_pairs_hook(where), parse_constant=_constant_hook(where),
                         parse_float=_float_hook(where))
    except json.JSONDecodeError as e:
        raise VerificationError(where, "JSON", "valid JSON", f"error at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise VerificationError(where, "JSON", "valid JSON", "nesting too deep") from None
    if expect is not None and not isinstance(doc, expect):
        raise VerificationError(where, "top level", type_name(expect()), type_name(doc))
    return doc


def read_json(path: str | Path, *, expect: type | None = dict) -> Any:
    """Read and parse ``path`` strictly (see the module docstring)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise VerificationError(p, "file", "present", "missing") from None
    except OSError as e:
        raise VerificationError(p, "file", "readable", f"{type(e).__name__}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise VerificationError(p, "encoding", "UTF-8 JSON", f"byte {e.start}: {e.reason}") from None
    return loads_json(text, p, expect=expect)


# ------------------------------------------------------------------ typed field access
_MISSING = object()


def _get(doc: dict[str, Any], key: str, path: str | Path, where: str, default: Any) -> Any:
    value = doc.get(key, _MISSING)
    if value is _MISSING:
        if default is not _MISSING:
            return default
        raise VerificationError(path, f"{where}{key}", "present", "missing")
    return value


def get_str(doc: dict[str, Any], key: str, path: str | Path, *, where: str = "", default: Any = _MISSING) -> Any:
    """``doc[key]`` as a string (or ``default`` when absent)."""
    v = _get(doc, key, path, where, default)
    if v is not default and not isinstance(v, str):
        raise VerificationError(path, f"{where}{key}", "a string", f"{type_name(v)} {v!r}")
    return v


def get_int(doc: dict[str, Any], key: str, path: str | Path, *, where: str = "", minimum: int | None = None,
            default: Any = _MISSING) -> Any:
    """``doc[key]`` as an integer (not a bool) >= ``minimum``."""
    v = _get(doc, key, path, where, default)
    if v is default:
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        raise VerificationError(path, f"{where}{key}", "an integer", f"{type_name(v)} {v!r}")
    if minimum is not None and v < minimum:
        raise VerificationError(path, f"{where}{key}", f"an integer >= {minimum}", v)
    return v


def get_list(doc: dict[str, Any], key: str, path: str | Path, *, where: str = "", default: Any = _MISSING) -> Any:
    """``doc[key]`` as an array."""
    v = _get(doc, key, path, where, default)
    if v is not default and not isinstance(v, list):
        raise VerificationError(path, f"{where}{key}", "an array", type_name(v))
    return v
