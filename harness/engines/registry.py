"""The engine registry: the built-in engines and those other installed packages declare.

Reasoning: docs/engines.md §"The registry".
"""

from __future__ import annotations

import difflib
import functools
from importlib.metadata import EntryPoint, entry_points

from harness.engines import llamacpp, transformers, vllm
from harness.engines.base import Engine
from harness.errors import FidelityError, MissingPackageError

#: The entry-point group other packages declare engines in.
ENTRY_POINT_GROUP = "fidelity.engines"

#: The engines that ship with the harness.
BUILTIN: tuple[Engine, ...] = (transformers.ENGINE, llamacpp.ENGINE, vllm.ENGINE)

#: What an engine object must provide (the members of :class:`harness.engines.base.Engine`).
_MEMBERS = ("name", "kinds", "install_hint", "available", "model_identity", "load")


def _load_entry_point(ep: EntryPoint) -> Engine:
    """The engine an entry point names, checked against the Engine protocol's members."""
    where = f"entry point {ep.name!r} = {ep.value!r} (group {ENTRY_POINT_GROUP}"
    where += f", distribution {ep.dist.name})" if ep.dist is not None else ")"
    try:
        engine = ep.load()
    except Exception as exc:  # an installed package's import error, whatever its type
        raise FidelityError(f"{where}: expected an importable engine object, found {type(exc).__name__}: {exc}") from exc
    missing = [m for m in _MEMBERS if not hasattr(engine, m)]
    if missing:
        raise FidelityError(f"{where}: expected an engine with {', '.join(_MEMBERS)}, found one lacking {', '.join(missing)}")
    if engine.name != ep.name:
        raise FidelityError(f"{where}: expected the engine's name to be the entry point's name {ep.name!r}, found {engine.name!r}")
    found: Engine = engine
    return found


@functools.cache
def engines() -> dict[str, Engine]:
    """Every registered engine by name: the built-in ones, then the entry points of ``fidelity.engines``."""
    found: dict[str, Engine] = {e.name: e for e in BUILTIN}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        engine = _load_entry_point(ep)
        if engine.name in found:
            raise FidelityError(f"engine name {engine.name!r} is registered twice (entry point {ep.value!r})")
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
    """Raise a MissingPackageError with the install command when the engine's package is missing."""
    if not engine.available():
        raise MissingPackageError(f"engine {engine.name!r}", engine.install_hint)
