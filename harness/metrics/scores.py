"""Per-position scores: the scorer's output, a plain container of numpy arrays (imports no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np


@dataclass
class PositionScores:
    """Per-position scores; every field is a numpy array of length N (one entry per position)."""

    kld: np.ndarray  # float64, nats, KL(p||q)
    jsd_bits: np.ndarray  # float64
    ear: np.ndarray  # float64, sum min(p, q)
    nll_ref: np.ndarray  # float64, -ln p(y)
    nll_cand: np.ndarray  # float64, -ln q(y)
    argmax_ref: np.ndarray  # int64, ties to the lowest token id
    argmax_cand: np.ndarray  # int64

    @property
    def top1(self) -> np.ndarray:
        """Boolean array: the two argmaxes agree."""
        agree: np.ndarray = self.argmax_ref == self.argmax_cand
        return agree

    def __len__(self) -> int:
        return int(self.kld.shape[0])

    @classmethod
    def empty(cls, n: int) -> PositionScores:
        def f() -> np.ndarray:
            return np.zeros(n, dtype=np.float64)

        def i() -> np.ndarray:
            return np.zeros(n, dtype=np.int64)

        return cls(f(), f(), f(), f(), f(), i(), i())

    @classmethod
    def concat(cls, parts: Sequence[PositionScores]) -> PositionScores:
        """Concatenate in order (e.g. the contexts of a shard)."""
        if not parts:
            return cls.empty(0)
        return cls(**{fl.name: np.concatenate([getattr(p, fl.name) for p in parts]) for fl in fields(cls)})

    def select(self, mask: np.ndarray) -> PositionScores:
        """Subset by boolean mask or integer index array."""
        return PositionScores(**{fl.name: getattr(self, fl.name)[mask] for fl in fields(self)})

    def to_dict(self) -> dict[str, np.ndarray]:
        return {fl.name: getattr(self, fl.name) for fl in fields(self)}
