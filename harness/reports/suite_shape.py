"""What aggregation needs to know about a suite, without its tokens: the suite hash, ``n_ctx`` and
every shard's index, hash and context range.

Aggregates and published sets record it (``"suite"`` block: the suite hash, ``n_ctx`` and the
shards; not the folder, so runs from different folders stay byte-identical), so ``fidelity verify`` can re-check
that every shard report belongs to the suite even where the suite folder is not at hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Union

from harness.errors import VerificationError
from harness.io.jsonio import get_int, get_list, get_str

if TYPE_CHECKING:
    from harness.inputs.suite import Suite


class ShardShapeJSON(TypedDict):
    """A recorded shard: index, ``sha256`` of its token rows, contexts ``[start, stop)``."""

    index: int
    sha256: str
    start: int
    stop: int


class SuiteJSON(TypedDict):
    """The recorded ``"suite"`` block (:meth:`SuiteShape.to_json`)."""

    suite_token_sha256: str
    n_ctx: int
    shards: list[ShardShapeJSON]


@dataclass(frozen=True)
class ShardShape:
    """One shard: index, ``sha256`` of its token rows, contexts ``[start, stop)``."""

    index: int
    sha256: str
    start: int
    stop: int


@dataclass(frozen=True)
class SuiteShape:
    """A suite as aggregation sees it (module docstring)."""

    root: str
    suite_token_sha256: str
    n_ctx: int
    shards: tuple[ShardShape, ...]

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def shard_indices(self, k: int) -> list[int]:
        s = self.shards[k]
        return list(range(s.start, s.stop))

    @classmethod
    def of(cls, suite: SuiteLike) -> SuiteShape:
        """From a loaded :class:`~harness.inputs.suite.Suite` (or a ``SuiteShape``, returned as is)."""
        if isinstance(suite, SuiteShape):
            return suite
        return cls(str(suite.root), str(suite.suite_token_sha256), int(suite.n_ctx),
                   tuple(ShardShape(int(s.index), str(s.sha256), int(s.start), int(s.stop)) for s in suite.shards))

    def to_json(self) -> SuiteJSON:
        # no path: two runs of one suite from different folders give byte-identical aggregates
        return {"suite_token_sha256": self.suite_token_sha256, "n_ctx": self.n_ctx,
                "shards": [{"index": s.index, "sha256": s.sha256, "start": s.start, "stop": s.stop} for s in self.shards]}

    @classmethod
    def from_json(cls, d: object, path: str | Path) -> SuiteShape:
        """Parse a recorded ``"suite"`` block; a malformed one is refused naming ``path``."""
        if not isinstance(d, dict):
            raise VerificationError(path, "suite", "an object (path, suite_token_sha256, n_ctx, shards)", type(d).__name__)
        shards = []
        for i, s in enumerate(get_list(d, "shards", path, where="suite.")):
            if not isinstance(s, dict):
                raise VerificationError(path, f"suite.shards[{i}]", "an object", type(s).__name__)
            w = f"suite.shards[{i}]."
            shards.append(ShardShape(get_int(s, "index", path, where=w, minimum=0), get_str(s, "sha256", path, where=w),
                                     get_int(s, "start", path, where=w, minimum=0), get_int(s, "stop", path, where=w, minimum=0)))
            if shards[-1].index != i:
                raise VerificationError(path, f"suite.shards[{i}].index", i, shards[-1].index)
        sha = get_str(d, "suite_token_sha256", path, where="suite.")
        return cls(f"suite {sha[:12]} (recorded in {path})", sha,
                   get_int(d, "n_ctx", path, where="suite.", minimum=2), tuple(shards))


#: What aggregation accepts as "the suite": a loaded suite, or its shape read from a report.
SuiteLike = Union["Suite", SuiteShape]
