"""Capture adapter for GGUF models through llama.cpp (llama-cpp-python).

Reasoning: docs/llamacpp.md §"The capture adapter".
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.engines.base import EngineOptions
from harness.engines.option_specs import OptionSpec, int_option, validate_options
from harness.errors import FidelityError, MissingPackageError, pip_extra
from harness.io.hashing import sha256_file
from harness.io.jsonio import JSONObject

if TYPE_CHECKING:
    from types import ModuleType

    import llama_cpp
    import numpy as np
    import torch

ENGINE_NAME = "llamacpp"
#: The extra, and how to build it portably (pip builds llama.cpp from source; a native AMX build crashed).
INSTALL_HINT = pip_extra("llamacpp") + ' (it builds llama.cpp: set CMAKE_ARGS="-DGGML_NATIVE=OFF" for a portable build)'

#: ``[candidates.options]`` of engine ``llamacpp`` (docs: docs/engines.md, "Engine options").
OPTIONS: dict[str, OptionSpec] = {
    "n_gpu_layers": OptionSpec("int", "layers offloaded to the GPU (-1: all; 0, the default: none)", -1, 100_000),
    "flash_attn": OptionSpec("bool", "flash attention (default false; changes logits slightly: recorded)"),
    "n_batch": OptionSpec("int", "logical batch size in tokens (default: the context length, one batch per context)", 1, 1 << 20),
    "n_ubatch": OptionSpec("int", "physical batch size in tokens (default: the context length)", 1, 1 << 20),
    "threads": OptionSpec("int", "CPU threads for generation and batch processing (default: --threads, else llama.cpp's)", 1, 4096),
}


def available() -> bool:
    """True when ``llama_cpp`` imports."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def _import() -> ModuleType:
    """The ``llama_cpp`` module (llama-cpp-python); its absence is a MissingPackageError with the install command."""
    try:
        return importlib.import_module("llama_cpp")
    except (ImportError, OSError) as e:
        raise MissingPackageError("llama-cpp-python", INSTALL_HINT, needed_for=f"engine 'llamacpp' ({e})") from None


def check_gguf(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise FidelityError(f"{p}: GGUF file not found (engine 'llamacpp' takes a .gguf file as model)")
    with open(p, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise FidelityError(f"{p}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    return p


def gguf_identity(path: str | Path) -> JSONObject:
    """Identity of a GGUF file by content."""
    p = check_gguf(path)
    return {"name": p.name, "format": "gguf", "sha256": sha256_file(p), "bytes": p.stat().st_size}


def engine_identity(extra_bufts: bool | None = None, options: Mapping[str, object] | None = None) -> dict[str, str]:
    """Version, CPU features, numerics-relevant settings; the candidate's options (canonical JSON) when given."""
    opts = dict(options or {})
    llama_cpp = _import()
    info = llama_cpp.llama_print_system_info()
    info = info.decode() if isinstance(info, bytes) else str(info)
    ident = {"name": ENGINE_NAME, "version": f"llama-cpp-python {llama_cpp.__version__}", "system_info": info.strip(),
             # numerics-relevant context settings (llama-perplexity's default -fa auto turns flash attention
             # on, which changes logits: pass -fa off to it to reproduce these captures)
             "flash_attn": "on" if opts.get("flash_attn") else "off", "kv_cache": "f16", "batch": "one batch per context"}
    if "n_batch" in opts or "n_ubatch" in opts:
        ident["batch"] = f"n_batch {opts.get('n_batch', 'n_ctx')}, n_ubatch {opts.get('n_ubatch', 'n_ctx')}"
    if extra_bufts is not None:
        ident["extra_bufts"] = str(extra_bufts).lower()
    if opts:
        ident["options"] = json.dumps(opts, sort_keys=True, separators=(",", ":"))
    return ident


@contextlib.contextmanager
def _no_extra_bufts(llama_cpp: ModuleType) -> Iterator[bool | None]:
    """Make ``Llama`` load with ``use_extra_bufts = False`` (no weight repacking) where the field exists."""
    import llama_cpp.llama as L

    orig = L.llama_cpp.llama_model_default_params
    probe = orig()
    if not hasattr(probe, "use_extra_bufts"):
        yield None
        return

    def patched() -> object:
        p = orig()
        p.use_extra_bufts = False
        return p

    L.llama_cpp.llama_model_default_params = patched
    try:
        yield False
    finally:
        L.llama_cpp.llama_model_default_params = orig


def load_model(
    path: str | Path, n_ctx: int, threads: int | None = None, hidden: bool = False, options: Mapping[str, object] | None = None
) -> tuple[llama_cpp.Llama, bool | None]:
    """A ``llama_cpp.Llama`` for ``path`` with all-position logits, one batch per context; with
    ``hidden`` also per-token embeddings without pooling (the output of the final norm).
    ``options`` (validated :data:`OPTIONS`) override GPU offload, flash attention, batch sizes, threads."""
    llama_cpp = _import()
    p = check_gguf(path)
    opts = dict(options or {})
    threads = int_option(opts, "threads", threads)
    n_batch = int_option(opts, "n_batch", n_ctx)
    n_ubatch = int_option(opts, "n_ubatch", n_batch if "n_batch" in opts else n_ctx)
    if n_ubatch > n_batch:
        raise FidelityError(f"{p}: engine 'llamacpp' options: n_ubatch ({n_ubatch}) may not exceed n_batch ({n_batch})")
    extra_kw: dict[str, Any] = {}
    if hidden:
        extra_kw = {"embedding": True, "pooling_type": llama_cpp.LLAMA_POOLING_TYPE_NONE}
    with _no_extra_bufts(llama_cpp) as extra:
        try:
            model = llama_cpp.Llama(
                model_path=str(p), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, logits_all=True,
                n_threads=threads, n_threads_batch=threads, n_gpu_layers=int_option(opts, "n_gpu_layers", 0), verbose=False,
                seed=0, flash_attn=bool(opts.get("flash_attn", False)), **extra_kw,
            )
        except (ValueError, RuntimeError) as e:
            raise FidelityError(f"{p}: llama.cpp could not load the model ({e})") from None
    return model, extra


def capture_logits(model: llama_cpp.Llama, token_ids: np.ndarray | Sequence[int]) -> torch.Tensor:
    """Logits of one context, rows ``0 .. n_ctx-2``: ``[n_ctx-1, vocab]`` float32 torch tensor."""
    import numpy as np
    import torch

    ids = [int(t) for t in np.asarray(token_ids).reshape(-1)]
    model.reset()
    model.eval(ids)
    scores = np.array(model.scores[: len(ids) - 1], dtype=np.float32, copy=True)
    return torch.from_numpy(scores)


def capture_hidden(model: llama_cpp.Llama, token_ids: np.ndarray | Sequence[int]) -> torch.Tensor:
    """Post-final-norm hidden states of one context (llama.cpp embeddings, no pooling), rows
    ``0 .. n_ctx-2``: ``[n_ctx-1, n_embd]`` bf16 torch tensor (a model loaded with ``hidden=True``)."""
    import numpy as np
    import torch

    llama_cpp = _import()
    ids = [int(t) for t in np.asarray(token_ids).reshape(-1)]
    model.reset()
    model.eval(ids)
    n_embd = int(model.n_embd())
    ptr = llama_cpp.llama_get_embeddings(model._ctx.ctx)
    if not ptr:
        raise FidelityError("llama.cpp returned no embeddings (was the model loaded with hidden=True?)")
    e = np.ctypeslib.as_array(ptr, shape=(len(ids) * n_embd,)).reshape(len(ids), n_embd)
    return torch.from_numpy(e[:-1].copy()).to(torch.bfloat16)


class LlamaCppLoaded:
    """A GGUF model loaded through llama.cpp (see :class:`harness.engines.base.LoadedModel`)."""

    def __init__(self, model: llama_cpp.Llama, extra_bufts: bool | None, options: Mapping[str, object] | None = None) -> None:
        self.model = model
        self.extra_bufts = extra_bufts
        self.options = dict(options or {})
        self.batch_size = 1
        self.hidden_size = int(model.n_embd())
        self.vocab_size = int(model.n_vocab())
        self.device = "cpu"

    def identity(self) -> dict[str, str]:
        return engine_identity(self.extra_bufts, self.options)

    def forward(self, token_ids: np.ndarray, kind: str) -> torch.Tensor:
        fn = capture_hidden if kind == "hidden_states" else capture_logits
        return fn(self.model, token_ids)

    def forward_batch(self, contexts: Sequence[np.ndarray], kind: str) -> list[torch.Tensor]:
        return [self.forward(c, kind) for c in contexts]  # llama.cpp evaluates one sequence per context

    def close(self) -> None:
        if hasattr(self.model, "close"):
            self.model.close()


class LlamaCppEngine:
    """Engine ``llamacpp``: a GGUF file through llama-cpp-python (logits by default, or hidden states)."""

    name = ENGINE_NAME
    kinds: tuple[str, ...] = ("logits", "hidden_states")
    install_hint = INSTALL_HINT
    options: Mapping[str, OptionSpec] = OPTIONS

    def available(self) -> bool:
        return available()

    def model_identity(self, model: Path) -> JSONObject:
        return gguf_identity(model)

    def load(self, model: Path, n_ctx: int, kind: str, options: EngineOptions) -> LlamaCppLoaded:
        opts = validate_options(ENGINE_NAME, OPTIONS, options.engine_options)
        m, extra = load_model(model, n_ctx, options.threads, hidden=kind == "hidden_states", options=opts)
        return LlamaCppLoaded(m, extra, opts)


#: The registered engine (see harness.engines.base).
ENGINE = LlamaCppEngine()

