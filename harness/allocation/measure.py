"""Measured effects of per-group choices: one model in memory, weights swapped in place, scored on the suite.

The reference model is loaded once (compute in float32: the weights keep their values exactly) and its
LM-head input is captured on the chosen contexts with its own weights (the reference side of every score).
A *layout* is applied by copying each unit's effective weight under its choice
(:meth:`harness.allocation.family.Family.weight`) into the model; the layout's LM-head input is captured
the same way (:func:`harness.attribution.ablation.capture`) and scored against the reference through the
shared head (:func:`harness.scoring.scorer.score_hidden`): per-context KLD sums.

Reasoning: docs/allocation.md §"Measuring effects".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from harness.allocation.family import Family
from harness.attribution.ablation import AblationModels, capture
from harness.engines.transformers import load_model
from harness.errors import FidelityError
from harness.scoring.scorer import score_hidden


class InProcess:
    """The reference model in memory, its capture on ``tokens``, and a scorer for any layout of ``family``."""

    def __init__(self, reference: Path, family: Family, tokens: np.ndarray, *, device: str = "cpu") -> None:
        self.family, self.tokens = family, np.asarray(tokens)
        dev = torch.device(device)
        model = load_model(reference, device="cpu", dtype="bfloat16").to(dev, torch.float32).eval()
        self.named = dict(model.named_parameters())
        missing = [u for u in family.units if u + ".weight" not in self.named]
        if missing:
            raise FidelityError(f"{reference}: the model has no weights for units {missing[:3]}")
        self.original = {u: self.named[u + ".weight"].detach().clone() for u in family.units}
        self.models = AblationModels(model, {}, {}, [], dev, Path(reference), Path(reference))
        self.ref_hidden = capture(self.models, self.tokens)
        self.head = model.get_output_embeddings().weight.detach().clone()  # type: ignore[operator]
        self.targets = torch.from_numpy(np.asarray(self.tokens[:, 1:], dtype=np.int64).reshape(-1))
        self.rows = self.tokens.shape[1] - 1
        self.variants_scored = 0

    def apply(self, layout: Mapping[str, str]) -> None:
        """Put each unit's effective weight under its choice into the model (units not named: the reference's)."""
        with torch.no_grad():
            for u in self.family.units:
                p = self.named[u + ".weight"]
                if u in layout:
                    p.copy_(torch.from_numpy(np.asarray(self.family.weight(u, layout[u]))).to(p.dtype))
                else:
                    p.copy_(self.original[u])

    def score(self, layout: Mapping[str, str]) -> np.ndarray:
        """Per-context KLD sums (float64 ``[n_contexts]``) of a layout against the reference."""
        self.apply(layout)
        hidden = capture(self.models, self.tokens)
        s = score_hidden(self.ref_hidden, hidden, self.head, self.targets, device=self.models.device)
        self.variants_scored += 1
        sums: np.ndarray = np.asarray(s.kld, dtype=np.float64).reshape(len(self.tokens), self.rows).sum(axis=1)
        return sums

    def unit_inputs(self, n_contexts: int) -> dict[str, torch.Tensor]:
        """Each unit's input ``[positions, in]`` in the reference's forward over the first ``n_contexts`` contexts."""
        self.apply({})
        grabbed: dict[str, list[torch.Tensor]] = {u: [] for u in self.family.units}
        mods = dict(self.models.model.named_modules())
        handles = []
        for u in self.family.units:
            def hook(_m: torch.nn.Module, args: tuple[torch.Tensor, ...], u: str = u) -> None:
                grabbed[u].append(args[0].detach().reshape(-1, args[0].shape[-1]))
            handles.append(mods[u].register_forward_pre_hook(hook))
        try:
            capture(self.models, self.tokens[:n_contexts])
        finally:
            for h in handles:
                h.remove()
        return {u: torch.cat(v) for u, v in grabbed.items()}


def group_variants(groups: Sequence[tuple[str, Sequence[str]]], base: Mapping[str, str],
                   choices: Sequence[str]) -> list[tuple[str, str]]:
    """The (group, choice) variants to measure: every choice of every group that changes the base layout."""
    out = []
    for name, units in groups:
        for c in choices:
            if any(base[u] != c for u in units):
                out.append((name, c))
    return out


def with_group(base: Mapping[str, str], units: Sequence[str], choice: str) -> dict[str, str]:
    """The base layout with every unit of one group at ``choice``."""
    layout = dict(base)
    for u in units:
        layout[u] = choice
    return layout
