"""A shard's summary kept across runs: a rerun of unchanged positions reads its statistics, not bootstraps them.

Each candidate x shard's ``metrics`` block (:func:`harness.run.shard_summary.shard_metrics`) is one entry of a
:func:`~harness.run.result_cache.signed_json_cache` in ``<cache_dir>/summaries/`` (``<candidate>-shardNN-<key>.json``,
signed with this user's capture cache key). Its binding (:func:`summary_binding`) is the scored positions'
(:func:`harness.run.score_cache.score_binding`: both stores, suite, shard, window, scorer, heads, versions) plus
the statistics settings (:func:`statistics_settings`: replicates, seed, level, interval method, power, and the
sha256 of the statistics code itself) and :data:`PROTOCOL`. The bootstrap is deterministic given these, so
a changed setting is another key: summarized again, never read. docs/performance.md ("Reruns").
"""

from __future__ import annotations

import functools
from pathlib import Path

from harness.io.hashing import files_sha256
from harness.io.jsonio import JSONObject
from harness.metrics import bootstrap
from harness.planning import design
from harness.run.result_cache import ResultCache, signed_json_cache

#: The protocol of an entry: a part of every key.
PROTOCOL = "fidelity.summary-cache/1"
#: The folder under ``[settings] cache_dir``.
FOLDER = "summaries"
#: The code a summary is computed by (the statistics package and the design helper), relative to ``harness/``.
_CODE = ("metrics", "planning/design.py", "run/shard_summary.py")


def statistics_code() -> list[Path]:
    """The source files of :data:`_CODE`, in a fixed order."""
    root = Path(__file__).resolve().parents[1]
    return [f for part in _CODE for f in (sorted((root / part).glob("*.py")) if (root / part).is_dir() else [root / part])]


@functools.cache
def statistics_code_sha256() -> str:
    """sha256 over the source files of :data:`_CODE` (names and bytes): an edited statistic is another key."""
    return files_sha256(statistics_code(), root=Path(__file__).resolve().parents[1])


def statistics_settings(n_boot: int, seed: int | None = None) -> JSONObject:
    """Every setting a shard's summary depends on besides its positions and window (module docstring);
    ``seed`` None: the bootstrap's default seed."""
    return {
        "n_boot": n_boot, "n_boot_tails": bootstrap.DEFAULT_N_BOOT_TAILS,
        "seed": bootstrap.DEFAULT_SEED if seed is None else seed,
        "level": bootstrap.LEVEL, "mean_method": bootstrap.MEAN_METHOD, "min_clusters": bootstrap.MIN_CLUSTERS,
        "tail_min_clusters": bootstrap.TAIL_MIN_CLUSTERS, "design_level": design.LEVEL, "power": design.POWER,
        "code_sha256": statistics_code_sha256(),
    }


def summary_binding(positions: JSONObject, statistics: JSONObject) -> JSONObject:
    """What the summary of one candidate x shard is computed from: its positions' binding and the statistics."""
    return {"protocol": PROTOCOL, "positions": positions, "statistics": statistics}


def summary_cache(cache_dir: Path, key: bytes) -> ResultCache[JSONObject]:
    """The summaries cache under ``cache_dir``, signed with ``key`` (this user's cache key)."""
    return signed_json_cache(Path(cache_dir) / FOLDER, key, PROTOCOL)
