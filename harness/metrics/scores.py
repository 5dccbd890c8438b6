"""Per-position scores: the scorer's output, a plain container of numpy arrays (imports no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np


@dataclass
class PositionScores:
    """Per-position scores; every field is a numpy array of length N (one entry per position).

    The top-k sets are the token ids of the k largest logits of each side (k is capped at the
    vocabulary size); the overlap counts the ids in both sets, so ``top10_overlap / 10`` is the
    fraction of the reference's top 10 the candidate keeps. A tie at the k-th place is broken by
    the lowest token id in the fused kernel and by ``torch.topk``'s order in the torch path (the
    two agree except where the k-th largest logit is tied).
    """

    kld: np.ndarray  # float64, nats, KL(p||q)
    jsd_bits: np.ndarray  # float64
    ear: np.ndarray  # float64, sum min(p, q)
    nll_ref: np.ndarray  # float64, -ln p(y)
    nll_cand: np.ndarray  # float64, -ln q(y)
    argmax_ref: np.ndarray  # int64, ties to the lowest token id
    argmax_cand: np.ndarray  # int64
    kld_rev: np.ndarray  # float64, nats, reverse KL(q||p) = sum q (ln q - ln p)
    entropy_ref: np.ndarray  # float64, nats, H(p) = -sum p ln p
    p_ref_top: np.ndarray  # float64, p(argmax p): the reference's confidence
    q_ref_top: np.ndarray  # float64, q(argmax p): the candidate's probability of the reference's top token
    top5_overlap: np.ndarray  # int64 in [0, 5]: tokens shared by the 5 largest logits of each side
    top10_overlap: np.ndarray  # int64 in [0, 10]: the same for the 10 largest

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

        return cls(f(), f(), f(), f(), f(), i(), i(), f(), f(), f(), f(), i(), i())

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
