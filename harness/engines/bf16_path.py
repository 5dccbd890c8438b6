"""bf16 work on CPUs without native bf16: through fp32 kernels, the same numbers up to summation order.

A bf16 GEMM accumulates the exact products of its bf16 operands in fp32 and rounds the result to bf16 once;
an fp32 GEMM over the same bf16 values, rounded to bf16, is that computation (only the summation order, which
differs between kernels anyway, can move a result by one bf16 unit). On a CPU without native bf16 (no
``avx512_bf16`` / ``amx_bf16``, or oneDNN held below it by ``ONEDNN_MAX_CPU_ISA``) torch's bf16 matmul is
emulated, tens of times slower than its fp32 GEMM; the ``fp32`` path computes a capture's linear layers,
matmuls and attention in fp32 and rounds each result to bf16 (:class:`Fp32Kernels`).

``FIDELITY_BF16_PATH`` (``auto`` | ``native`` | ``fp32``) chooses; ``auto``: ``native`` on a GPU or a CPU
with native bf16, else ``fp32``. A capture taken on the ``fp32`` path says so in its engine identity
(``bf16_path``) and has a cache folder of its own. docs/performance.md ("bf16 where it is emulated").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING, cast

from harness.errors import FidelityError

if TYPE_CHECKING:
    import torch

ENV = "FIDELITY_BF16_PATH"
#: A model whose bf16 2-D weights widen to at most this many fp32 bytes has them widened once and held (the faster
#: lever on small models: no widening per call); a larger one widens each weight when it is used (no second, twice
#: as large copy of the model). docs/performance.md ("bf16 where it is emulated").
HOLD_WIDENED_BYTES = 1 << 30
CHOICES = ("auto", "native", "fp32")
#: The CPU flags (``/proc/cpuinfo``) of native bf16 arithmetic.
NATIVE_FLAGS = ("avx512_bf16", "amx_bf16")


@lru_cache(maxsize=1)
def cpu_bf16_flags() -> tuple[str, ...]:
    """Those of :data:`NATIVE_FLAGS` this CPU reports (Linux ``/proc/cpuinfo``; elsewhere none are read)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return tuple(f for f in NATIVE_FLAGS if f in have)
    except OSError:
        pass
    return ()


def native_bf16() -> bool:
    """Whether this CPU runs bf16 GEMMs natively: a native flag, and oneDNN allowed to use it (torch's check,
    which ``ONEDNN_MAX_CPU_ISA=AVX2`` turns off)."""
    import torch

    mkldnn: ModuleType = torch.backends.mkldnn  # a property module whose attributes mypy cannot see
    try:
        onednn = bool(mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn = False
    return onednn and bool(cpu_bf16_flags())


def bf16_path(device: str, environ: Mapping[str, str] | None = None) -> str:
    """``native`` or ``fp32``: how bf16 work runs on ``device`` (module docstring)."""
    env = os.environ if environ is None else environ
    choice = env.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise FidelityError(f"{ENV}: expected one of {', '.join(CHOICES)}, found {choice!r}")
    if choice != "auto":
        return choice
    return "native" if not device.startswith("cpu") or native_bf16() else "fp32"


def _is_bf16_cpu(t: object) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and t.device.type == "cpu"


def _wide(t: torch.Tensor | None) -> torch.Tensor | None:
    import torch

    return t.float() if t is not None and t.dtype == torch.bfloat16 else t


class Fp32Kernels:
    """A torch function mode: inside it, ``linear``, ``matmul`` / ``mm`` / ``bmm`` / ``@`` and
    ``scaled_dot_product_attention`` whose tensor inputs are bf16 on a CPU run in fp32 and return their
    result rounded to bf16. ``widened``: fp32 copies of weights held for the model's life, by ``id`` of the
    bf16 weight (none: each weight is widened when it is used)."""

    def __init__(self, widened: Mapping[int, torch.Tensor] | None = None) -> None:
        from torch.overrides import TorchFunctionMode

        outer = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func: Callable[..., object], types: Sequence[type], args: Sequence[object] = (),
                                   kwargs: Mapping[str, object] | None = None) -> object:
                return outer.dispatch(func, tuple(args), dict(kwargs or {}))

        self.widened = dict(widened or {})
        self.mode = _Mode()
        import torch
        import torch.nn.functional as F

        self._matmuls = {torch.matmul, torch.mm, torch.bmm, torch.Tensor.matmul, torch.Tensor.__matmul__,
                         torch.Tensor.mm, torch.Tensor.bmm}
        self._linear = F.linear
        self._sdpa = F.scaled_dot_product_attention

    def _weight(self, w: torch.Tensor) -> torch.Tensor:
        held = self.widened.get(id(w))
        return held if held is not None and held.shape == w.shape else w.float()

    def dispatch(self, func: Callable[..., object], args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        """``func(*args, **kwargs)``, through fp32 when it is one of the kernels and its inputs are bf16 on a CPU."""
        import torch

        floats = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if not floats or not all(_is_bf16_cpu(t) for t in floats):  # masks and indices may be bool / int
            return func(*args, **kwargs)
        if func is self._linear:
            x, w = cast("torch.Tensor", args[0]), cast("torch.Tensor", args[1])
            b = cast("torch.Tensor | None", args[2] if len(args) > 2 else kwargs.get("bias"))
            return self._linear(x.float(), self._weight(w), _wide(b)).to(torch.bfloat16)
        if func in self._matmuls or func is self._sdpa:
            wide_args = [_wide(a) if isinstance(a, torch.Tensor) else a for a in args]
            wide_kw = {k: _wide(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            return cast("torch.Tensor", func(*wide_args, **wide_kw)).to(torch.bfloat16)
        return func(*args, **kwargs)


def widen_weights(model: torch.nn.Module) -> dict[int, torch.Tensor]:
    """fp32 copies of a model's 2-D bf16 weights, by ``id`` (held once: twice the bf16 model's memory)."""
    import torch

    return {id(p): p.detach().float() for p in model.parameters() if p.dtype == torch.bfloat16 and p.ndim == 2}


def fp32_kernels_for(model: torch.nn.Module) -> Fp32Kernels:
    """The fp32 path's kernels for ``model``: its weights widened once and held when they fit
    :data:`HOLD_WIDENED_BYTES`, else widened per use (the same numbers either way, bit for bit)."""
    import torch

    wide = sum(4 * p.numel() for p in model.parameters() if p.dtype == torch.bfloat16 and p.ndim == 2)
    return Fp32Kernels(widen_weights(model) if wide <= HOLD_WIDENED_BYTES else None)
