"""Settings that are not package versions but change the numbers an engine captures.

The capture cache is keyed by the model's content, the engine, its options, the device and the runtime's
package versions (:meth:`harness.run.session.FidelitySession.live_store_path`). The same packages can still
compute other numbers when the process is told to: an environment variable that picks another kernel, another
instruction set or another precision. :func:`numeric_settings` gives those a capture is taken under, so a
changed one means another cache folder (a capture is never reused across them), while a setting that only
moves memory, threads or logging leaves the key alone.

Reasoning: docs/engines.md §"Settings that change the numbers".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from harness.io.jsonio import JSONObject

TORCH_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE",
             "DNNL_DEFAULT_FPMATH_MODE", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "PYTORCH_TUNABLEOP_ENABLED")
TRANSFORMERS_ENV = ("USE_HUB_KERNELS", "TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR")
VLLM_ENV = ("VLLM_CPU_ATTN_SPLIT_KV", "VLLM_CPU_INT4_W4A8", "VLLM_FLOAT32_MATMUL_PRECISION", "VLLM_BATCH_INVARIANT",
            "VLLM_DISABLED_KERNELS", "VLLM_USE_TRITON_AWQ", "VLLM_MARLIN_INPUT_DTYPE",
            "VLLM_USE_DEEP_GEMM", "VLLM_ROCM_USE_AITER")
LLAMACPP_ENV = ("GGML_CPU_TILED_MM", "GGML_CPU_TILED_MM_FORCE", "GGML_CPU_DISABLE_FUSION", "LLAMA_ATTN_ROT_DISABLE",
                "GGML_BACKEND_PATH", "GGML_KLEIDIAI_SME", "GGML_CUDA_CUBLAS_COMPUTE_TYPE", "GGML_CUDA_DISABLE_FUSION")
#: The environment variables that change an engine's numbers, by engine name (another engine: torch's).
ENGINE_ENV: dict[str, tuple[str, ...]] = {
    "transformers": TORCH_ENV + TRANSFORMERS_ENV,
    "vllm": TORCH_ENV + VLLM_ENV,
    "llamacpp": LLAMACPP_ENV,
}
#: Engines that run no torch kernels of their own (torch's process state does not apply).
_NO_TORCH = ("llamacpp",)


def numeric_settings(engine: str, environ: Mapping[str, str] | None = None) -> JSONObject:
    """The settings (docs/engines.md §"Settings that change the numbers") ``engine`` captures under now: ``env`` (the chosen variables that are
    set, by name) and, for torch engines, torch's ``float32_matmul_precision``."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {"env": {k: env[k] for k in ENGINE_ENV.get(engine, TORCH_ENV) if k in env}}
    if engine not in _NO_TORCH:
        import torch

        out["torch_float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return out
