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

from harness.errors import FidelityError
from harness.inputs.identity import QUANTIZATION_JSON, model_identity, quantized_module, runtime_identity

if TYPE_CHECKING:
    import numpy as np
    import torch

    from harness.capture.store import CaptureStore
    from harness.inputs.suite import Suite

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


def load_model(model_dir: str | Path, device: str = "cpu", dtype: str | torch.dtype = "bfloat16", trust_remote_code: bool = False) -> torch.nn.Module:
    """Load a causal LM in eval mode from safetensors; quantized checkpoints (``quantization.json``)
    go to ``harness.engines.quantized.load_quantized``."""
    root = check_model_dir(model_dir)
    tdtype = parse_dtype(dtype)
    if (root / QUANTIZATION_JSON).is_file():
        model: torch.nn.Module = quantized_module().load_quantized(root, device, tdtype)
        model.eval()
        return model
    from transformers import AutoModelForCausalLM

    try:
        # cast: transformers types .to()/.eval() of a PreTrainedModel through an untyped wrapper
        model = cast("torch.nn.Module", AutoModelForCausalLM.from_pretrained(
            root, dtype=tdtype, use_safetensors=True, trust_remote_code=trust_remote_code))
    except (OSError, ValueError) as e:
        raise FidelityError(f"{root}: transformers could not load the model ({e})") from None
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


def capture(
    model_dir: str | Path,
    suite: Suite | str | Path,
    out: str | Path,
    shards: Sequence[int] | str | None = None,
    device: str = "cpu",
    dtype: str = "bfloat16",
    progress: bool = True,
    kind: str = "hidden_states",
    trust_remote_code: bool = False,
) -> CaptureStore:
    """Capture ``suite`` contexts (all, or the given shards) of a model into the store at ``out``.

    Resumable: contexts already in the store whose files verify are skipped. Concurrent runs into
    one store are safe (see ``harness.capture.store.StoreWriter``). Returns the opened store.
    """
    import torch
    from tqdm import tqdm

    from harness.capture.store import CaptureStore, StoreWriter
    from harness.inputs.suite import Suite as SuiteCls

    if not isinstance(suite, SuiteCls):
        suite = SuiteCls.load(suite)
    indices = suite.context_indices(shards)
    if kind not in ("hidden_states", "logits"):
        raise FidelityError(f"unknown capture kind {kind!r}: choose hidden_states or logits")

    ident = model_identity(model_dir)
    model = load_model(model_dir, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    vocab = model_vocab_size(model)
    if vocab < suite.vocab_size:
        raise FidelityError(
            f"{model_dir}: model vocab {vocab} is smaller than the suite's tokenizer vocab {suite.vocab_size} "
            f"({suite.root / 'suite.json'}): token ids could exceed the model's embedding"
        )
    if kind == "hidden_states":
        width, store_dtype, fn = model_hidden_size(model), "bfloat16", capture_hidden
    else:
        width, store_dtype, fn = vocab, "float32", capture_logits
    writer = StoreWriter(out, suite, kind, width, store_dtype, ident, engine_identity(), runtime_identity(), str(torch.device(device)))
    with writer:
        bar = tqdm(indices, desc=f"capture {Path(model_dir).name}", unit="ctx", disable=not progress)
        skipped = 0
        for i in bar:
            if writer.done(i):
                skipped += 1
                bar.set_postfix(skipped=skipped)
                continue
            writer.write(i, fn(model, suite.tokens[i]))
    return CaptureStore.open(out, suite)
