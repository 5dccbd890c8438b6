"""The one capture loop every engine shares.

``capture(engine, model, suite, out)`` loads the model through its engine
(:mod:`harness.engines.base`), checks its vocabulary against the suite's, opens a resumable
:class:`~harness.capture.store.StoreWriter` with the model's and the engine's identity, and writes
one context file per suite context of the chosen shards, skipping contexts already stored and
verified. Engines implement only load and forward-to-capture-point. An engine loaded with a
``batch_size`` above 1 (a ``[candidates.options]`` setting) gets the pending contexts that many at a
time (``forward_batch``); every context is still written and verified on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.capture.store import MANIFEST, CaptureStore, StoreWriter
from harness.engines import identity as engine_identity
from harness.engines.base import STORE_DTYPES, EngineOptions
from harness.engines.registry import get_engine, require
from harness.errors import FidelityError
from harness.inputs.suite import Suite as SuiteCls
from harness.io.jsonio import JSONObject

if TYPE_CHECKING:
    import torch

    from harness.inputs.suite import Suite


def check_finite_output(model: Path, engine: str, kind: str, index: int, out: torch.Tensor) -> None:
    """Refuse a forward pass with NaN/Inf values, naming the model (its own output, before any file is written)."""
    import torch

    finite = torch.isfinite(out)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        row = int(torch.nonzero(~finite)[0][0]) if out.dim() >= 2 else 0
        raise FidelityError(
            f"{model}: the model's own {kind} output is not finite: {bad} NaN/Inf value(s) in context {index} "
            f"(first at row {row}, the prediction after token {row}) through engine {engine!r}. The checkpoint or its "
            "engine produces them (broken weights, an overflowing activation); nothing of this context was written."
        )


def capture(
    engine: str,
    model: str | Path,
    suite: Suite | str | Path,
    out: str | Path,
    shards: Sequence[int] | str | None = None,
    kind: str | None = None,
    options: EngineOptions | None = None,
    progress: bool = True,
    identity: JSONObject | None = None,
    cache_key: bytes | None = None,
) -> CaptureStore:
    """Capture ``suite`` contexts (all, or the given shards) of ``model`` through ``engine`` into the
    store at ``out``; ``kind`` defaults to the engine's first kind. Resumable: contexts already in the
    store whose files verify are skipped. Returns the opened store.

    ``identity``: the model's identity by content when the caller has it already (the engine's
    ``model_identity``, computed once per run), so its weight files are not hashed again.

    ``cache_key``: this user's cache key when ``out`` is a cache folder (:mod:`harness.capture.cache_sign`):
    the manifest is signed, and an existing one without a valid signature is not believed (all recaptured)."""
    from tqdm import tqdm


    eng = get_engine(engine)
    kind = kind or eng.kinds[0]
    if kind not in eng.kinds:
        raise FidelityError(f"engine {eng.name!r} cannot capture kind {kind!r}: choose {' or '.join(eng.kinds)}")
    require(eng)
    options = options or EngineOptions()
    if not isinstance(suite, SuiteCls):
        suite = SuiteCls.load(suite)
    indices = suite.context_indices(shards)
    model = Path(model)
    ident = identity if identity is not None else eng.model_identity(model)
    loaded = eng.load(model, suite.n_ctx, kind, options)
    try:
        if loaded.vocab_size < suite.vocab_size:
            raise FidelityError(
                f"{model}: model vocab {loaded.vocab_size} is smaller than the suite's tokenizer vocab {suite.vocab_size} "
                f"({suite.root / 'suite.json'}): token ids could exceed the model's embedding"
            )
        width = loaded.hidden_size if kind == "hidden_states" else loaded.vocab_size
        # a new store: the first context is run and checked before the store's folder or any of its files exist,
        # so a model whose output is NaN/Inf (broken weights) is refused having written nothing
        probe: dict[int, Any] = {}
        if indices and not (Path(out) / MANIFEST).exists():
            probe[indices[0]] = loaded.forward(suite.tokens[indices[0]], kind)
            check_finite_output(model, eng.name, kind, indices[0], probe[indices[0]])
        writer = StoreWriter(out, suite, kind, width, STORE_DTYPES[kind], ident, loaded.identity(), engine_identity.runtime_identity(), loaded.device,
                             cache_key=cache_key)
        with writer:
            todo = [i for i in indices if not writer.done(i)]
            batch = max(1, int(getattr(loaded, "batch_size", 1)))
            bar = tqdm(total=len(indices), initial=len(indices) - len(todo), desc=f"capture {model.name} ({eng.name})",
                       unit="ctx", disable=not progress)
            with bar:
                for b0 in range(0, len(todo), batch):
                    group = todo[b0 : b0 + batch]
                    if batch == 1:
                        rows = [probe.pop(group[0]) if group[0] in probe else loaded.forward(suite.tokens[group[0]], kind)]
                    else:
                        rows = loaded.forward_batch([suite.tokens[i] for i in group], kind)
                    if len(rows) != len(group):
                        raise FidelityError(f"engine {eng.name!r} returned {len(rows)} contexts for a batch of {len(group)}")
                    for i, out_i in zip(group, rows, strict=True):
                        check_finite_output(model, eng.name, kind, i, out_i)
                        writer.write(i, out_i)
                    bar.update(len(group))
    finally:
        loaded.close()
    return CaptureStore.open(out, suite)
