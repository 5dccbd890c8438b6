"""Capture adapter for Hugging Face transformers models (safetensors only, never pickle).

Capture point: the input of the LM head (``model.get_output_embeddings()``), taken with a forward
pre-hook. For decoder LMs that is the post-final-norm hidden state; the test suite checks that
``hidden @ head.T`` reproduces the model's own logits. Row ``r`` predicts token ``r+1``, so rows
``0 .. n_ctx-2`` are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from harness.engines.base import EngineOptions
from harness.engines.identity import QUANTIZATION_JSON, model_identity, quantized_module
from harness.errors import FidelityError

if TYPE_CHECKING:
    import numpy as np
    import torch

ENGINE_NAME = "transformers"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


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
        raise FidelityError(
            f"{root / 'config.json'}: quantization_config.quant_method {method!r} needs the package {package!r}, "
            f"which is not installed: install it with: pip install {package}"
        )


def check_loading_info(root: Path, info: dict[str, Any]) -> None:
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


def load_model(model_dir: str | Path, device: str = "cpu", dtype: str | torch.dtype = "bfloat16", trust_remote_code: bool = False) -> torch.nn.Module:
    """Load a causal LM in eval mode from safetensors; quantized checkpoints (``quantization.json``)
    go to ``harness.engines.quantized.load_quantized``."""
    root = check_model_dir(model_dir)
    tdtype = parse_dtype(dtype)
    if (root / QUANTIZATION_JSON).is_file():
        model: torch.nn.Module = quantized_module().load_quantized(root, device, tdtype)
        model.eval()
        return model
    check_quantization_package(root)
    from transformers import AutoModelForCausalLM

    try:
        # cast: transformers types .to()/.eval() of a PreTrainedModel through an untyped wrapper
        result: Any = AutoModelForCausalLM.from_pretrained(
            root, dtype=tdtype, use_safetensors=True, trust_remote_code=trust_remote_code, output_loading_info=True
        )
        model = cast("torch.nn.Module", result[0])
        info: dict[str, Any] = result[1]
    except ImportError as e:
        raise FidelityError(f"{root / 'config.json'}: a package this checkpoint needs is missing ({e})") from None
    except (OSError, ValueError) as e:
        raise FidelityError(f"{root}: transformers could not load the model ({e})") from None
    check_loading_info(root, info)
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


def _as_input(model: torch.nn.Module, token_ids: np.ndarray | torch.Tensor | Sequence[int]) -> torch.Tensor:
    import numpy as np
    import torch

    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))
    if ids.ndim != 1 or ids.numel() < 2:
        raise FidelityError(f"expected one context of at least 2 token ids, got shape {list(ids.shape)}")
    device = next(model.parameters()).device
    return ids.unsqueeze(0).to(device)


def capture_hidden(model: torch.nn.Module, token_ids: np.ndarray | torch.Tensor | Sequence[int]) -> torch.Tensor:
    """Post-final-norm hidden states (the LM head's input) of one context: ``[n_ctx-1, hidden]`` bf16 on CPU."""
    import torch

    ids = _as_input(model, token_ids)
    grabbed: list[torch.Tensor] = []

    def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        grabbed.append(args[0].detach())

    handle = model.get_output_embeddings().register_forward_pre_hook(hook)  # type: ignore[operator]
    try:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)
    finally:
        handle.remove()
    if len(grabbed) != 1:
        raise FidelityError(f"LM head was called {len(grabbed)} times in one forward pass; expected exactly once")
    h = grabbed[0][0]
    if h.shape[0] != ids.shape[1]:
        raise FidelityError(f"LM head saw {h.shape[0]} rows for {ids.shape[1]} tokens (logits_to_keep?)")
    return h[:-1].to(device="cpu", dtype=torch.bfloat16).contiguous()


def capture_logits(model: torch.nn.Module, token_ids: np.ndarray | torch.Tensor | Sequence[int]) -> torch.Tensor:
    """The model's own logits of one context, rows ``0 .. n_ctx-2``: ``[n_ctx-1, vocab]`` float32 on CPU."""
    import torch

    ids = _as_input(model, token_ids)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=False)
    logits: torch.Tensor = out.logits[0, :-1].to(device="cpu", dtype=torch.float32).contiguous()
    return logits


def engine_identity() -> dict[str, str]:
    import transformers

    return {"name": ENGINE_NAME, "version": transformers.__version__}


class TransformersLoaded:
    """A transformers model loaded for capture (see :class:`harness.engines.base.LoadedModel`)."""

    def __init__(self, model: torch.nn.Module, device: str) -> None:
        self.model: torch.nn.Module | None = model
        self.hidden_size = model_hidden_size(model)
        self.vocab_size = model_vocab_size(model)
        self.device = device

    def identity(self) -> dict[str, str]:
        return engine_identity()

    def forward(self, token_ids: np.ndarray, kind: str) -> torch.Tensor:
        assert self.model is not None, "model was closed"
        fn = capture_hidden if kind == "hidden_states" else capture_logits
        return fn(self.model, token_ids)

    def close(self) -> None:
        self.model = None


class TransformersEngine:
    """Engine ``transformers``: a Hugging Face model folder (safetensors), any format transformers loads."""

    name = ENGINE_NAME
    kinds: tuple[str, ...] = ("hidden_states", "logits")
    install_hint = "pip install transformers"

    def available(self) -> bool:
        try:
            import transformers  # noqa: F401
        except ImportError:
            return False
        return True

    def model_identity(self, model: Path) -> dict[str, Any]:
        return model_identity(model)

    def load(self, model: Path, n_ctx: int, kind: str, options: EngineOptions) -> TransformersLoaded:
        import torch

        m = load_model(model, device=options.device, dtype=options.dtype, trust_remote_code=options.trust_remote_code)
        return TransformersLoaded(m, str(torch.device(options.device)))


#: The registered engine (see harness.engines.base).
ENGINE = TransformersEngine()

