"""The store of :mod:`harness.io.kept` results across runs: a window comparison, a paired report, a figure.

Each result is one entry of a :func:`~harness.run.result_cache.signed_json_cache` in ``<cache_dir>/results/``
(``<name>-<key>.json``, signed with this user's capture cache key), its binding the result's
:func:`harness.io.kept.kept_key` (the sha256 of its inputs by content and of the code computing it) plus
:data:`PROTOCOL`. The pytest plugin opens it for a run with the scores cache on (``[settings] score_cache``).
docs/performance.md ("Reruns").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.io.jsonio import JSONObject
from harness.io.kept import Store
from harness.run.result_cache import ResultCache, signed_json_cache
from harness.run.reuse import ReuseLog

#: The protocol of an entry: a part of every key.
PROTOCOL = "fidelity.kept-result/1"
#: The folder under ``[settings] cache_dir``.
FOLDER = "results"


def results_store(cache_dir: Path, key: bytes, reuse: ReuseLog | None = None) -> Store:
    """Results kept in ``<cache_dir>/results/``, signed with ``key``; ``reuse`` notes each read or computed one
    (under the cache ``results``, per result name)."""
    cache: ResultCache[JSONObject] = signed_json_cache(Path(cache_dir) / FOLDER, key, PROTOCOL)

    def store(name: str, bound: JSONObject, compute: Callable[[], JSONObject]) -> JSONObject:
        n_reused = len(cache.reused)
        value = cache.get(name, {"protocol": PROTOCOL, **bound}, compute)
        if reuse is not None:
            unit = [int(str(bound.get("inputs_sha256", "0"))[:12] or "0", 16)]
            hit = len(cache.reused) > n_reused
            reuse.note("results", name, reused=unit if hit else [], computed=[] if hit else unit, where=str(cache.folder))
        return value

    return store
