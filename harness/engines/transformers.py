"""Capture adapter for Hugging Face transformers models (safetensors only, never pickle).

Capture point: the input of the LM head (``model.get_output_embeddings()``), taken with a forward
pre-hook. For decoder LMs that is the post-final-norm hidden state; the test suite checks that
``hidden @ head.T`` reproduces the model's own logits. Row ``r`` predicts token ``r+1``, so rows
``0 .. n_ctx-2`` are kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from harness.engines.base import EngineOptions
from harness.engines.bf16_path import bf16_path, fp32_kernels_for
from harness.engines.compressed_config import check_compressed_tensors
from harness.engines.identity import model_identity
from harness.engines.load_checks import check_before_loading
from harness.engines.option_specs import OptionSpec, int_option, table_option, validate_options
from harness.engines.quant_manifest import QUANT_FILE, is_quantized_checkpoint
from harness.errors import EXTRAS, FidelityError, MissingPackageError, pip_extra
from harness.io.jsonio import JSONObject

if TYPE_CHECKING:
    import numpy as np
    import torch

ENGINE_NAME = "transformers"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

#: ``[candidates.options]`` of engine ``transformers`` (docs: docs/engines.md, "Engine options").
OPTIONS: dict[str, OptionSpec] = {
    "device_map": OptionSpec(
        "str|table",
        "where the layers go: 'auto' (accelerate spreads them over the GPUs, then the CPU, within max_memory), "
        "one device ('cpu', 'cuda:0'), or a table module name -> device; replaces moving the model to --device",
    ),
    "max_memory": OptionSpec("table", "per-device memory limits for device_map = 'auto', e.g. {0 = '70GiB', cpu = '100GiB'}"),
    "attn_implementation": OptionSpec(
        "str", "attention kernel", choices=("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
    ),
    "batch_size": OptionSpec("int", "contexts per forward pass (all have the suite's length: no padding)", 1, 4096),
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"``/``"float16"``/``"float32"`` (or a torch dtype) -> torch dtype."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}
    if dtype not in table:
        raise FidelityError(f"unknown dtype {dtype!r}: choose bfloat16, float16 or float32")
    return table[dtype]


def check_model_dir(model_dir: str | Path) -> Path:
    """Refuse folders without config.json, without safetensors weights, or with only pickle weights."""
    root = Path(model_dir)
    if not root.is_dir():
        raise FidelityError(f"{root}: model folder not found")
    if not (root / "config.json").is_file():
        raise FidelityError(f"{root / 'config.json'}: config.json missing: not a transformers model folder")
    if not list(root.glob("*.safetensors")):
        pickles = sorted(p.name for p in root.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
        if pickles:
            raise FidelityError(
                f"{root}: only pickle weights found ({', '.join(pickles)}); the harness never loads pickle files: "
                "convert them to safetensors first"
            )
        raise FidelityError(f"{root}: no *.safetensors weight files found")
    return root


#: ``quantization_config.quant_method`` -> (importable module, pip package) of the packages transformers
#: needs to load such a checkpoint. Methods transformers handles alone (``fp8``) are not listed.
QUANT_PACKAGES: dict[str, tuple[str, str]] = {
    "compressed-tensors": ("compressed_tensors", "compressed-tensors"),
    "compressed_tensors": ("compressed_tensors", "compressed-tensors"),
    "gptq": ("gptqmodel", "gptqmodel"),
    "awq": ("awq", "autoawq"),
    "auto-round": ("auto_round", "auto-round"),
    "bitsandbytes": ("bitsandbytes", "bitsandbytes"),
    "hqq": ("hqq", "hqq"),
    "quanto": ("optimum.quanto", "optimum-quanto"),
    "torchao": ("torchao", "torchao"),
    "aqlm": ("aqlm", "aqlm"),
    "eetq": ("eetq", "eetq"),
    "vptq": ("vptq", "vptq"),
}


def check_quantization_package(root: Path) -> None:
    """A checkpoint whose ``quantization_config.quant_method`` needs a package that does not import is a
    FidelityError naming the method and the install command (instead of an ImportError from deep inside)."""
    import importlib.util
    import json

    try:
        cfg = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise FidelityError(f"{root / 'config.json'}: not a readable JSON file ({e})") from None
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if not isinstance(qc, dict):
        return
    method = str(qc.get("quant_method", ""))
    if method not in QUANT_PACKAGES:
        return
    module, package = QUANT_PACKAGES[method]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        install = pip_extra(package) if package in EXTRAS else f"pip install {package}"
        raise MissingPackageError(package, install,
                                  needed_for=f"{root / 'config.json'}: quantization_config.quant_method {method!r}")


def check_loading_info(root: Path, info: Mapping[str, Iterable[object]]) -> None:
    """Refuse a load that left weights missing (randomly initialised) or ignored stored tensors: transformers
    reports them in ``output_loading_info`` and would otherwise run a partly random model silently."""
    problems = []
    for field in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(str(k) for k in (info.get(field) or ()))
        if keys:
            shown = ", ".join(keys[:5]) + (f", ... ({len(keys)} in all)" if len(keys) > 5 else "")
            problems.append(f"{field}: {shown}")
    if problems:
        raise FidelityError(
            f"{root}: transformers could not interpret the checkpoint fully ({'; '.join(problems)}): "
            "expected every weight loaded and every stored tensor used; refusing to capture a partly random model"
        )


def _has_quantization_config(root: Path) -> bool:
    try:
        cfg = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(cfg, dict) and isinstance(cfg.get("quantization_config"), dict)


def load_model(
    model_dir: str | Path,
    device: str = "cpu",
    dtype: str | torch.dtype = "bfloat16",
    trust_remote_code: bool = False,
    options: Mapping[str, object] | None = None,
) -> torch.nn.Module:
    """Load a causal LM in eval mode from safetensors; quantized checkpoints (``quantization.json``)
    go to ``harness.engines.quant_weights.load_quantized``. ``options`` (validated :data:`OPTIONS`):
    ``device_map`` / ``max_memory`` place the layers instead of ``device``; ``attn_implementation``
    picks the attention kernel."""
    root = check_model_dir(model_dir)
    tdtype = parse_dtype(dtype)
    opts = dict(options or {})
    if "max_memory" in opts and "device_map" not in opts:
        raise FidelityError(f"{root}: engine 'transformers' option 'max_memory' needs 'device_map' (e.g. device_map = 'auto')")
    if is_quantized_checkpoint(root):
        if set(opts) - {"batch_size"}:
            raise FidelityError(f"{root}: a {QUANT_FILE} checkpoint (this project's simulated format) takes only the "
                                f"option batch_size, found {', '.join(sorted(set(opts) - {'batch_size'}))}")
        from harness.engines.quant_weights import load_quantized  # imports torch: only when loading

        model: torch.nn.Module = load_quantized(root, device, tdtype)
        model.eval()
        return model
    check_quantization_package(root)

    check_compressed_tensors(root)  # the configuration against the stored tensors, before the library believes it
    check_before_loading(root, opts, quantized=_has_quantization_config(root), trust_remote_code=trust_remote_code)
    from transformers import AutoModelForCausalLM

    kw: dict[str, Any] = {}
    if "device_map" in opts:
        import importlib.util

        if importlib.util.find_spec("accelerate") is None:  # transformers places layers through accelerate (an extra)
            raise MissingPackageError.extra("accelerate", "accelerate",
                                            needed_for=f"{root}: engine 'transformers' option 'device_map'")
        kw["device_map"] = opts["device_map"]
        if "max_memory" in opts:  # accelerate names GPUs by integer index
            kw["max_memory"] = {(int(k) if str(k).isdigit() else k): v for k, v in table_option(opts, "max_memory").items()}
    if "attn_implementation" in opts:
        kw["attn_implementation"] = opts["attn_implementation"]
    try:
        # cast: transformers types .to()/.eval() of a PreTrainedModel through an untyped wrapper
        result: Any = AutoModelForCausalLM.from_pretrained(
            root, dtype=tdtype, use_safetensors=True, trust_remote_code=trust_remote_code, output_loading_info=True, **kw
        )
        model = cast("torch.nn.Module", result[0])
        info: dict[str, Any] = result[1]
    except ImportError as e:
        raise MissingPackageError(e.name or "a package this checkpoint needs", f"install what transformers names: {e}",
                                  needed_for=str(root / "config.json")) from None
    except (OSError, ValueError) as e:
        raise FidelityError(f"{root}: transformers could not load the model ({e})") from None
    except (RuntimeError, AssertionError, NotImplementedError, KeyError, TypeError, AttributeError) as e:
        given = ", ".join(f"{k} = {opts[k]!r}" for k in sorted(opts) if k != "batch_size") or "none"
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise FidelityError(f"{root}: transformers could not load the model with engine options {given} "
                            f"({type(e).__name__}: {first})") from None
    check_loading_info(root, info)
    if "device_map" not in opts:
        model.to(device)
    model.eval()
    return model


def model_vocab_size(model: torch.nn.Module) -> int:
    """Rows of the model's output embedding (its logit width)."""
    head = model.get_output_embeddings()  # type: ignore[operator]
    if head is None or not hasattr(head, "weight"):
        raise FidelityError(f"{type(model).__name__} has no output embedding (LM head) to capture in front of")
    return int(head.weight.shape[0])


def model_hidden_size(model: torch.nn.Module) -> int:
    head = model.get_output_embeddings()  # type: ignore[operator]
    return int(head.weight.shape[1])


def _as_input(model: torch.nn.Module, token_ids: np.ndarray | torch.Tensor | Sequence[int] | Sequence[Sequence[int]]) -> torch.Tensor:
    import numpy as np
    import torch

    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))
    if ids.ndim == 1:
        ids = ids.unsqueeze(0)
    if ids.ndim != 2 or ids.shape[1] < 2 or ids.shape[0] < 1:
        raise FidelityError(f"expected contexts of at least 2 token ids, got shape {list(ids.shape)}")
    emb = model.get_input_embeddings()  # type: ignore[operator]
    device = emb.weight.device if emb is not None and hasattr(emb, "weight") else next(model.parameters()).device
    return ids.to(device)


class _Stop(Exception):
    """Raised by :func:`head_inputs`' hook to end a forward pass at the LM head's input."""


def head_inputs(model: torch.nn.Module, ids: torch.Tensor, *, stop: bool = True) -> torch.Tensor:
    """The LM head's input ``[batch, n_ctx, hidden]`` of one forward pass over ``ids`` ``[batch, n_ctx]``
    (post-final-norm hidden states, as the model computed them): the one capture point of every path that
    reads hidden states from a transformers model. ``stop``: end the pass there (the head itself is not
    run); ``False`` runs the whole forward pass (the engine's capture, whose hooks — accelerate's
    offloading — expect a pass to finish). A head called other than once, or on other rows than the
    tokens (``logits_to_keep``), is a :class:`~harness.errors.FidelityError`."""
    import torch

    grabbed: list[torch.Tensor] = []

    def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        grabbed.append(args[0].detach())
        if stop:
            raise _Stop

    handle = model.get_output_embeddings().register_forward_pre_hook(hook)  # type: ignore[operator]
    try:
        with torch.inference_mode():
            try:
                model(input_ids=ids, use_cache=False)
            except _Stop:
                pass
    finally:
        handle.remove()
    if len(grabbed) != 1:
        raise FidelityError(f"LM head was called {len(grabbed)} times in one forward pass; expected exactly once")
    h = grabbed[0]
    if h.shape[:2] != ids.shape:
        raise FidelityError(f"LM head saw {list(h.shape[:2])} rows for {list(ids.shape)} tokens (logits_to_keep?)")
    return h


def capture_hidden_batch(model: torch.nn.Module, contexts: np.ndarray | torch.Tensor | Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Post-final-norm hidden states (the LM head's input) of ``B`` equal-length contexts in one
    forward pass: ``B`` tensors ``[n_ctx-1, hidden]`` bf16 on CPU."""
    import torch

    h = head_inputs(model, _as_input(model, contexts), stop=False)
    return [h[b, :-1].to(device="cpu", dtype=torch.bfloat16).contiguous() for b in range(h.shape[0])]


def capture_hidden(model: torch.nn.Module, token_ids: np.ndarray | torch.Tensor | Sequence[int]) -> torch.Tensor:
    """Post-final-norm hidden states (the LM head's input) of one context: ``[n_ctx-1, hidden]`` bf16 on CPU."""
    import numpy as np

    ids = np.asarray(token_ids)
    if ids.ndim != 1:
        raise FidelityError(f"expected one context of at least 2 token ids, got shape {list(ids.shape)}")
    return capture_hidden_batch(model, ids[None])[0]


def capture_logits_batch(model: torch.nn.Module, contexts: np.ndarray | torch.Tensor | Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """The model's own logits of ``B`` equal-length contexts in one forward pass, rows ``0 .. n_ctx-2``."""
    import torch

    ids = _as_input(model, contexts)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=False)
    return [out.logits[b, :-1].to(device="cpu", dtype=torch.float32).contiguous() for b in range(ids.shape[0])]


def capture_logits(model: torch.nn.Module, token_ids: np.ndarray | torch.Tensor | Sequence[int]) -> torch.Tensor:
    """The model's own logits of one context, rows ``0 .. n_ctx-2``: ``[n_ctx-1, vocab]`` float32 on CPU."""
    import numpy as np

    ids = np.asarray(token_ids)
    if ids.ndim != 1:
        raise FidelityError(f"expected one context of at least 2 token ids, got shape {list(ids.shape)}")
    return capture_logits_batch(model, ids[None])[0]


def engine_identity(options: Mapping[str, object] | None = None) -> dict[str, str]:
    """Engine name and version; the candidate's options (canonical JSON) when any were given."""
    import transformers

    ident = {"name": ENGINE_NAME, "version": transformers.__version__}
    if options:
        ident["options"] = json.dumps(dict(options), sort_keys=True, separators=(",", ":"))
    return ident


class TransformersLoaded:
    """A transformers model loaded for capture (see :class:`harness.engines.base.LoadedModel`)."""

    def __init__(self, model: torch.nn.Module, device: str, options: Mapping[str, object] | None = None) -> None:
        self.model: torch.nn.Module | None = model
        self.hidden_size = model_hidden_size(model)
        self.vocab_size = model_vocab_size(model)
        self.device = device
        self.options = dict(options or {})
        self.batch_size = int_option(self.options, "batch_size", 1)
        import torch

        #: bf16 work through fp32 kernels (:mod:`harness.engines.bf16_path`): a bf16 model on a CPU without
        #: native bf16 (or ``FIDELITY_BF16_PATH=fp32``); None: the model's own kernels
        on_cpu = all(p.device.type == "cpu" for p in model.parameters())
        bf16 = any(p.dtype == torch.bfloat16 for p in model.parameters())
        self.kernels = fp32_kernels_for(model) if on_cpu and bf16 and bf16_path("cpu") == "fp32" else None

    def identity(self) -> dict[str, str]:
        ident = engine_identity(self.options)
        if self.kernels is not None:
            ident["bf16_path"] = "fp32"
        return ident

    def forward(self, token_ids: np.ndarray, kind: str) -> torch.Tensor:
        assert self.model is not None, "model was closed"
        fn = capture_hidden if kind == "hidden_states" else capture_logits
        if self.kernels is None:
            return fn(self.model, token_ids)
        with self.kernels.mode:
            return fn(self.model, token_ids)

    def forward_batch(self, contexts: Sequence[np.ndarray], kind: str) -> list[torch.Tensor]:
        import numpy as np

        assert self.model is not None, "model was closed"
        fn = capture_hidden_batch if kind == "hidden_states" else capture_logits_batch
        if self.kernels is None:
            return fn(self.model, np.stack([np.asarray(c) for c in contexts]))
        with self.kernels.mode:
            return fn(self.model, np.stack([np.asarray(c) for c in contexts]))

    def close(self) -> None:
        self.model = None


class TransformersEngine:
    """Engine ``transformers``: a Hugging Face model folder (safetensors), any format transformers loads."""

    name = ENGINE_NAME
    kinds: tuple[str, ...] = ("hidden_states", "logits")
    install_hint = "pip install transformers"
    options: Mapping[str, OptionSpec] = OPTIONS

    def available(self) -> bool:
        """True when ``transformers`` is installed (found, not imported: importing it costs seconds)."""
        import importlib.util

        try:
            return importlib.util.find_spec("transformers") is not None
        except (ImportError, ValueError):
            return False

    def model_identity(self, model: Path) -> JSONObject:
        return model_identity(model)

    def load(self, model: Path, n_ctx: int, kind: str, options: EngineOptions) -> TransformersLoaded:
        import torch

        opts = validate_options(ENGINE_NAME, OPTIONS, options.engine_options)
        m = load_model(model, device=options.device, dtype=options.dtype, trust_remote_code=options.trust_remote_code,
                       options=opts)
        device = str(torch.device(options.device)) if "device_map" not in opts else _placement(m)
        return TransformersLoaded(m, device, opts)


def _placement(model: torch.nn.Module) -> str:
    """The devices a ``device_map``-placed model runs on, e.g. ``cuda:0+cuda:1+cpu`` (first use order)."""
    seen: list[str] = []
    for p in model.parameters():
        d = str(p.device)
        if d not in seen:
            seen.append(d)
    return "+".join(seen)


#: The registered engine (see harness.engines.base).
ENGINE = TransformersEngine()

