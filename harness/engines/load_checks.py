"""Checks of a transformers checkpoint and its engine options against the machine and the model, before loading.

The model is built on the ``meta`` device from its ``config.json`` (no memory, no weights read) and compared
with the safetensors headers: a stored tensor whose shape differs from the configuration's is refused in one
line naming the tensor, the expected and the found shape (in a quantized checkpoint, its floating tensors). ``device_map`` must name devices this machine has
(never ``meta`` or ``disk``: weights left there are not computed on) and modules the model has;
``device_map = "auto"`` with a ``max_memory`` whose budgets cannot hold the weights is refused with the numbers;
``attn_implementation`` naming a kernel whose package does not import is refused naming the option.
docs/refuses.md ("Engine options").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from harness.errors import FidelityError, MissingPackageError
from harness.io.safetensors_header import read_header

if TYPE_CHECKING:
    import torch

#: Packages the attention kernels need (module to import, pip package).
ATTENTION_PACKAGES = {"flash_attention_2": ("flash_attn", "flash-attn"), "flash_attention_3": ("flash_attn_interface", "flash-attn-3")}
_DEVICE = re.compile(r"^(cpu|mps|cuda|xpu|cuda:\d+|xpu:\d+|\d+)$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
#: Stored dtypes of tensors kept unquantized: under a parameter's name, the parameter itself, at its shape.
_FLOAT = frozenset({"F64", "F32", "F16", "BF16"})


def safetensors_headers(root: Path) -> dict[str, tuple[Path, list[int], str]]:
    """``{tensor name: (file, shape, dtype)}`` of every ``*.safetensors`` file in ``root`` (headers only)."""
    out: dict[str, tuple[Path, list[int], str]] = {}
    for f in sorted(root.glob("*.safetensors")):
        for name, t in read_header(f).tensors.items():
            out[name] = (f, list(t.shape), t.dtype)
    return out


def _meta_model(root: Path, trust_remote_code: bool = False) -> torch.nn.Module:
    """The model of ``root/config.json`` built on the meta device (shapes only), or None if that cannot be done."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(root, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            return cast("torch.nn.Module", AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                config, trust_remote_code=trust_remote_code))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, ImportError, AttributeError) as exc:
        raise FidelityError(f"{root / 'config.json'}: transformers could not build the model it describes ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def check_shapes(root: Path, model: torch.nn.Module, headers: Mapping[str, tuple[Path, list[int], str]], *,
                 quantized: bool = False) -> None:
    """Every stored tensor the model has a parameter or buffer for has the shape the configuration gives it. In a
    quantized checkpoint (a ``quantization_config``) only the tensors stored in a floating type (:data:`_FLOAT`) are
    compared: a packed or low-bit tensor keeps another shape under the parameter's name (bitsandbytes' 4-bit
    ``weight``) and is checked by its scheme's own reader."""
    own = {k: list(v.shape) for k, v in model.state_dict().items()}
    for name, (f, shape, dtype) in sorted(headers.items()):
        if quantized and dtype not in _FLOAT:
            continue
        want = own.get(name)
        if want is not None and want != shape:
            raise FidelityError(f"{f}: tensor {name}: expected shape {want} (from {root / 'config.json'}), found {shape}")


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_device(where: str, value: object) -> None:
    v = str(value)
    if v in ("meta", "disk"):
        raise FidelityError(f"{where}: expected a device that computes (cpu, cuda:N), found {v!r} (weights placed there "
                            "are never loaded into memory: the model would run with missing weights)")
    if not _DEVICE.match(v):
        raise FidelityError(f"{where}: expected a device (cpu, cuda, cuda:N, mps, xpu:N, a GPU index), found {v!r}")
    if v.startswith("cuda") or v.isdigit():
        n = _cuda_count()
        index = int(v.rsplit(":", 1)[1]) if ":" in v else (int(v) if v.isdigit() else 0)
        if index >= n:
            raise FidelityError(f"{where}: expected a CUDA device this machine has ({n} visible: "
                                f"{', '.join(f'cuda:{i}' for i in range(n)) or 'none'}), found {v!r}")


def parse_size(where: str, value: object) -> int:
    """A ``max_memory`` budget in bytes: an integer, or ``'70GiB'`` / ``'500MB'`` (ASCII digits, a known unit)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE.match(str(value)) if isinstance(value, str) and value.isascii() else None
    if m is None:
        raise FidelityError(f"{where}: expected a size like '70GiB', '500MB' or a byte count, found {value!r}")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])


def check_placement(root: Path, opts: Mapping[str, object], model: torch.nn.Module, headers: Mapping[str, tuple[Path, list[int], str]]) -> None:
    """``device_map`` and ``max_memory`` against this machine and the model (module docstring)."""
    dm = opts.get("device_map")
    if dm is None:
        return
    prefix = f"{root}: engine 'transformers' option"
    if isinstance(dm, str):
        if dm not in ("auto", "balanced", "balanced_low_0", "sequential"):
            _check_device(f"{prefix} device_map", dm)
    else:
        modules = {name for name, _ in model.named_modules()}
        for key, dev in dict(cast("Mapping[str, object]", dm)).items():
            if str(key) not in modules:
                raise FidelityError(f"{prefix} device_map: expected module names of the model (like "
                                    f"{', '.join(sorted(m for m in modules if m)[:3])}), found {key!r}")
            _check_device(f"{prefix} device_map[{key!r}]", dev)
    mm = opts.get("max_memory")
    if mm is None:
        return
    budgets = {str(k): parse_size(f"{prefix} max_memory[{k!r}]", v) for k, v in dict(cast("Mapping[str, object]", mm)).items()}
    for k in budgets:
        if k != "cpu":
            _check_device(f"{prefix} max_memory key", k)
    need = sum(_DTYPE_BYTES.get(dtype, 2) * _numel(shape) for _f, shape, dtype in headers.values())
    have = sum(budgets.values())
    if have < need:
        raise FidelityError(f"{prefix} max_memory: expected budgets holding the weights ({need} bytes, {need / 2**30:.3f} GiB), "
                            f"found {have} bytes in all ({', '.join(f'{k} = {v}' for k, v in budgets.items())}): the rest "
                            "would be offloaded to meta or disk and never computed on")


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def check_attention(root: Path, opts: Mapping[str, object]) -> None:
    """An ``attn_implementation`` whose kernel package does not import is refused naming the option."""
    import importlib.util

    impl = opts.get("attn_implementation")
    if impl in ATTENTION_PACKAGES:
        module, package = ATTENTION_PACKAGES[str(impl)]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise MissingPackageError(package, f"pip install {package}",
                                      needed_for=f"{root}: engine 'transformers' option attn_implementation = {impl!r}")


def check_before_loading(root: Path, opts: Mapping[str, object], *, quantized: bool, trust_remote_code: bool = False) -> None:
    """All of the above; for a quantized checkpoint (``quantization_config``) the shapes of its floating tensors."""
    check_attention(root, opts)
    headers = safetensors_headers(root)
    model = _meta_model(root, trust_remote_code)
    check_shapes(root, model, headers, quantized=quantized)
    check_placement(root, opts, model, headers)
