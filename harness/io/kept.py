"""Deterministic results kept across runs, by their inputs' content: a rerun reads what it would compute again.

A computation whose result is a JSON object and depends only on its inputs (a window comparison, a paired
report, a rendered figure) is wrapped in :func:`kept`: ``kept(name, inputs, code, compute)``. Without a store
it is ``compute()``. Within :func:`kept_by` (the pytest plugin opens one over the signed results cache,
:mod:`harness.run.result_cache`), the result is looked up by :func:`kept_key`: the sha256 of the inputs'
canonical JSON (arrays by their bytes, :func:`harness.io.hashing.content_sha256`) and of the code that computes it; a hit is
read, a miss computed and kept. docs/performance.md ("Reruns").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from harness.io.hashing import content_sha256, files_sha256

#: ``store(name, key, compute)``: the result named by ``key`` (:func:`kept_key`), read when kept, else computed.
Store = Callable[[str, dict[str, Any], Callable[[], dict[str, Any]]], dict[str, Any]]
_stores: list[Store] = []
#: A result: a JSON object (a TypedDict of the computing module, or a plain dict).
_R = TypeVar("_R", bound=Mapping[str, Any])


@contextmanager
def kept_by(store: Store) -> Iterator[None]:
    """Within the block, :func:`kept` results go through ``store``."""
    _stores.append(store)
    try:
        yield
    finally:
        _stores.remove(store)


def kept_key(name: str, inputs: object, code: Sequence[str | Path]) -> dict[str, Any]:
    """What a kept result is looked up by: its name, its inputs' :func:`~harness.io.hashing.content_sha256` and the sha256 of the
    source files ``code`` (an edited computation is another key)."""
    return {"name": name, "inputs_sha256": content_sha256(inputs), "code_sha256": files_sha256(code)}


def kept(name: str, inputs: object, code: Sequence[str | Path], compute: Callable[[], _R]) -> _R:
    """``compute()``, or the kept result of the same ``inputs`` and ``code`` within :func:`kept_by` (a JSON object
    of the shape ``compute`` returns: it was written from one)."""
    if not _stores:
        return compute()
    return cast(_R, _stores[-1](name, kept_key(name, inputs, code), lambda: dict(compute())))
