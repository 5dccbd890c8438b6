"""The engine interface and the engine registry.

An *engine* runs a model over token ids and hands back the tensor at the capture point; the shared
capture loop (:mod:`harness.capture.loop`) does everything else (suite, shard selection, identity,
resumable store writing, progress). An engine implements two things:

* ``load(model, n_ctx, kind, options)`` -> a :class:`LoadedModel` (its sizes, its engine identity),
* ``LoadedModel.forward(token_ids, kind)`` -> ``[n_ctx-1, width]`` rows, row ``r`` predicting token ``r+1``:
  post-final-norm hidden states (``kind="hidden_states"``, stored bf16) or logits (``"logits"``, float32).

Registry: every module of the package ``harness.engines`` that defines a module-level ``ENGINE``
(an object satisfying :class:`Engine`) is an engine, named by ``ENGINE.name``. Adding an engine is
adding one module there; configuration validation, the live captures of a pytest run, ``fidelity
capture --engine`` and the cache identity all read this registry.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harness.errors import FidelityError

if TYPE_CHECKING:
    import numpy as np
    import torch

#: Capture kinds and the dtype each is stored in.
STORE_DTYPES: dict[str, str] = {"hidden_states": "bfloat16", "logits": "float32"}

#: The package whose modules are searched for ``ENGINE`` objects.
ENGINES_PACKAGE = "harness.engines"


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

    def available(self) -> bool:
        """True when the engine's package imports."""
        ...

    def model_identity(self, model: Path) -> dict[str, Any]:
        """Identity of the model by content (cache keys and store headers)."""
        ...

    def load(self, model: Path, n_ctx: int, kind: str, options: EngineOptions) -> LoadedModel:
        """Load ``model`` for contexts of ``n_ctx`` tokens, to capture ``kind``."""
        ...


@functools.cache
def engines() -> dict[str, Engine]:
    """Every registered engine by name (modules of ``harness.engines`` defining ``ENGINE``)."""
    pkg = importlib.import_module(ENGINES_PACKAGE)
    found: dict[str, Engine] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{ENGINES_PACKAGE}.{info.name}")
        engine = getattr(module, "ENGINE", None)
        if engine is None:
            continue
        if engine.name in found:
            raise FidelityError(f"engine name {engine.name!r} is registered twice ({info.name})")
        found[engine.name] = engine
    return found


def engine_names() -> tuple[str, ...]:
    """Registered engine names, ``transformers`` first, then alphabetical."""
    names = sorted(engines(), key=lambda n: (n != "transformers", n))
    return tuple(names)


def get_engine(name: str, where: str = "") -> Engine:
    """The engine called ``name``; an unknown name is a FidelityError with a near match."""
    table = engines()
    if name not in table:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        prefix = f"{where}: " if where else ""
        raise FidelityError(f"{prefix}engine: expected one of {', '.join(engine_names())}, found {name!r}{hint}")
    return table[name]


def require(engine: Engine) -> None:
    """Raise a FidelityError with the install command when the engine's package is missing."""
    if not engine.available():
        raise FidelityError(f"engine {engine.name!r} is not installed: install it with: {engine.install_hint}")
