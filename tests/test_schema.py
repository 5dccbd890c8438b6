"""harness.io.schema.schema_of: a TypedDict record as its own recursive check (its keys, nested records,
lists, maps, nullables, literals and NotRequired keys), under postponed annotations as the records use."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

import pytest

from harness.errors import VerificationError
from harness.io.schema import check, schema_of


class _Inner(TypedDict):
    n: int
    note: NotRequired[str]


class _Outer(TypedDict):
    name: str
    rows: list[_Inner]
    by: dict[str, _Inner]
    lo: float | None
    kind: Literal["a", "b"]
    maybe: NotRequired[_Inner]


def test_schema_of_a_typed_dict_is_recursive() -> None:
    """schema_of: nested records, lists, maps, nullables, literals, NotRequired keys (postponed annotations)."""
    good = {"name": "x", "rows": [{"n": 1}, {"n": 2, "note": "y"}], "by": {"k": {"n": 3}}, "lo": None, "kind": "a"}
    check(good, schema_of(_Outer), "f.json")
    for bad, where, expected in [
        ({**good, "rows": [{"n": 1}, {}]}, "rows[1].n", "present"),
        ({**good, "by": {"k": {"n": "3"}}}, "by.k.n", "an integer"),
        ({**good, "lo": "0"}, "lo", "null or a finite number"),
        ({**good, "kind": "c"}, "kind", '"a" or "b"'),
        ({**good, "maybe": {"note": "z"}}, "maybe.n", "present"),
        ({k: v for k, v in good.items() if k != "name"}, "name", "present"),
    ]:
        with pytest.raises(VerificationError) as e:
            check(bad, schema_of(_Outer), "f.json")
        assert (e.value.what, e.value.expected) == (where, expected)


def test_checked_narrows_a_read_document_only_after_its_records_check() -> None:
    """checked: the same object back when it matches the record (no copy), a refusal naming the file, the key
    under ``where`` and what was expected otherwise; a bare ``dict`` record accepts any JSON object only."""
    from harness.io.schema import checked

    doc: dict[str, object] = {"name": "x", "rows": [], "by": {}, "lo": 0.5, "kind": "b"}
    assert checked(doc, _Outer, "f.json") is doc
    with pytest.raises(VerificationError) as e:
        checked({**doc, "rows": [{"n": 1.5}]}, _Outer, "f.json", "payload")
    assert (e.value.what, e.value.expected) == ("payload.rows[0].n", "an integer")
    assert checked({"any": [1, "x"]}, dict, "f.json") == {"any": [1, "x"]}
    with pytest.raises(VerificationError):
        checked([1], dict, "f.json")
