"""Settings that are not package versions but change the numbers an engine captures.

The capture cache is keyed by the model's content, the engine, its options, the device and the runtime's
package versions (:meth:`harness.run.session.FidelitySession.live_store_path`). The same packages can still
compute other numbers when the process is told to: an environment variable that picks another kernel, another
instruction set or another precision. :func:`numeric_settings` gives those a capture is taken under, so a
changed one means another cache folder (a capture is never reused across them), while a setting that only
moves memory, threads or logging leaves the key alone.

Chosen, per engine (a variable counts only when set; unset means the library's default):

* every torch engine (``transformers``, ``vllm``, and any engine another package declares):
  ``ATEN_CPU_CAPABILITY`` (the ISA torch dispatches its CPU kernels for: ``avx2`` and ``avx512`` reduce in other
  orders), ``ONEDNN_MAX_CPU_ISA`` / ``DNNL_MAX_CPU_ISA`` (oneDNN's ISA: AMX bf16 tiles or not),
  ``ONEDNN_DEFAULT_FPMATH_MODE`` / ``DNNL_DEFAULT_FPMATH_MODE`` (fp32 matmuls computed in bf16 / tf32),
  ``NVIDIA_TF32_OVERRIDE`` and ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE`` (TF32 on GPUs), ``PYTORCH_TUNABLEOP_ENABLED``
  (GEMM algorithms chosen by timing), and torch's ``float32_matmul_precision`` as the process has it;
* ``transformers``: ``USE_HUB_KERNELS`` (layers replaced by kernels from the Hub) and
  ``TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR`` (the fp8 linear kernel); the attention implementation and the dtype
  are candidate options (``[candidates.options]``), keyed with the options;
* ``vllm`` (from vLLM's ``envs.py``): ``VLLM_CPU_ATTN_SPLIT_KV`` (CPU attention split over the KV length: another
  summation), ``VLLM_CPU_INT4_W4A8`` (int4 checkpoints served with int8 activations), ``VLLM_FLOAT32_MATMUL_PRECISION``,
  ``VLLM_BATCH_INVARIANT`` (batch-invariant kernels), ``VLLM_DISABLED_KERNELS``, ``VLLM_USE_TRITON_AWQ``, ``VLLM_MARLIN_INPUT_DTYPE``, ``VLLM_USE_DEEP_GEMM``, ``VLLM_ROCM_USE_AITER``;
* ``llamacpp`` (from ggml's and llama.cpp's ``getenv`` calls): ``GGML_CPU_TILED_MM`` / ``GGML_CPU_TILED_MM_FORCE``
  (tiled matmul kernels), ``GGML_CPU_DISABLE_FUSION`` (fused operations), ``LLAMA_ATTN_ROT_DISABLE`` (the
  attention rotation of a quantized KV cache), ``GGML_BACKEND_PATH`` (another backend), ``GGML_KLEIDIAI_SME``,
  ``GGML_CUDA_CUBLAS_COMPUTE_TYPE``, ``GGML_CUDA_DISABLE_FUSION``.

Left out on purpose: thread counts and placement (``OMP_NUM_THREADS``, ``VLLM_CPU_OMP_THREADS_BIND``,
``VLLM_CPU_NUM_OF_RESERVED_CPU``, ``GGML_TOTAL_THREADS``: they change the summation order of a reduction, an
effect at the rounding level every comparison of this harness already tolerates, and keying them would split
the cache per machine), memory sizes (``VLLM_CPU_KVCACHE_SPACE``), process layout
(``VLLM_ENABLE_V1_MULTIPROCESSING``) and logging or debugging switches.
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
    """The settings (module docstring) ``engine`` captures under now: ``env`` (the chosen variables that are
    set, by name) and, for torch engines, torch's ``float32_matmul_precision``."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {"env": {k: env[k] for k in ENGINE_ENV.get(engine, TORCH_ENV) if k in env}}
    if engine not in _NO_TORCH:
        import torch

        out["torch_float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return out
