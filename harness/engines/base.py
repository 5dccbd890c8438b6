"""The engine interface: what an engine implements (the registry is :mod:`harness.engines.registry`).

An *engine* runs a model over token ids and hands back the tensor at the capture point; the shared
capture loop (:mod:`harness.capture.loop`) does everything else (suite, shard selection, identity,
resumable store writing, progress). An engine implements two things:

* ``load(model, n_ctx, kind, options)`` -> a :class:`LoadedModel` (its sizes, its engine identity),
* ``LoadedModel.forward(token_ids, kind)`` -> ``[n_ctx-1, width]`` rows, row ``r`` predicting token ``r+1``:
  post-final-norm hidden states (``kind="hidden_states"``, stored bf16) or logits (``"logits"``, float32).

An engine is an object satisfying :class:`Engine`, named by its ``name``; the registry
(:mod:`harness.engines.registry`) holds the built-in ones and those other packages declare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harness.io.jsonio import JSONObject

if TYPE_CHECKING:
    import numpy as np
    import torch

    from harness.engines.option_specs import OptionSpec

#: Capture kinds and the dtype each is stored in.
STORE_DTYPES: dict[str, str] = {"hidden_states": "bfloat16", "logits": "float32"}

@dataclass(frozen=True)
class EngineOptions:
    """Settings a capture passes to an engine's ``load`` (an engine ignores what it cannot use)."""

    #: ``cpu``, ``cuda`` or ``cuda:N``.
    device: str = "cpu"
    #: Compute dtype: ``bfloat16``, ``float16`` or ``float32``.
    dtype: str = "bfloat16"
    #: CPU threads (None: the engine's default).
    threads: int | None = None
    #: Allow a model's own Python code (off unless asked).
    trust_remote_code: bool = False
    #: The candidate's engine-specific options (``[candidates.options]``), validated against the
    #: engine's ``options`` table (:func:`harness.engines.option_specs.validate_options`).
    engine_options: Mapping[str, Any] = field(default_factory=dict)


class LoadedModel(Protocol):
    """A model loaded by an engine, ready to run contexts."""

    #: Width of the hidden state at the capture point.
    hidden_size: int
    #: Logit width (rows of the LM head).
    vocab_size: int
    #: Device string recorded in the store header.
    device: str

    def identity(self) -> dict[str, str]:
        """Engine identity recorded in the store: name, versions, numerics-relevant settings."""
        ...

    def forward(self, token_ids: np.ndarray, kind: str) -> torch.Tensor:
        """One context's ``[n_ctx-1, width]`` rows at the capture point (``kind``: see STORE_DTYPES)."""
        ...

    def forward_batch(self, contexts: Sequence[np.ndarray], kind: str) -> list[torch.Tensor]:
        """Several contexts in one engine call (as many as :attr:`batch_size`): one ``forward`` result each."""
        ...

    #: Contexts per engine call in the capture loop (1: one at a time, the default).
    batch_size: int

    def close(self) -> None:
        """Release the model (memory, threads, files)."""
        ...


class Engine(Protocol):
    """What an engine module exposes as ``ENGINE``."""

    #: Name used in ``fidelity.toml`` (``engine = "..."``) and ``--engine``.
    name: str
    #: Capture kinds this engine supports; the first is its default.
    kinds: tuple[str, ...]
    #: The install command shown when the engine's package is missing.
    install_hint: str
    #: Options a candidate may give this engine (``[candidates.options]``), by name (an engine from
    #: another package may leave it out: it then takes none).
    options: Mapping[str, OptionSpec]

    def available(self) -> bool:
        """True when the engine's package imports."""
        ...

    def model_identity(self, model: Path) -> JSONObject:
        """Identity of the model by content (cache keys and store headers)."""
        ...

    def load(self, model: Path, n_ctx: int, kind: str, options: EngineOptions) -> LoadedModel:
        """Load ``model`` for contexts of ``n_ctx`` tokens, to capture ``kind``."""
        ...
