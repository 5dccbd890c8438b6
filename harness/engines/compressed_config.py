"""A compressed-tensors checkpoint's ``quantization_config`` checked against its stored tensors, before any
engine loads it.

Reasoning: docs/engines.md §"compressed-tensors checks".
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from harness.errors import VerificationError
from harness.io.jsonio import read_json
from harness.io.safetensors_header import read_header
from harness.io.schema import check, schema_of


#: What the check reads of ``quantization_config`` (harness.io.schema).
class WeightsScheme(TypedDict):
    """A group's ``weights``: bits, group size, scale strategy and number type (``int`` unless ``float``)."""

    num_bits: int
    group_size: NotRequired[int | None]
    strategy: NotRequired[str | None]
    type: NotRequired[str]


class ConfigGroup(TypedDict):
    """One ``config_groups`` entry: the modules it targets, its format and its weights' scheme."""

    format: NotRequired[str | None]
    targets: NotRequired[list[str] | None]
    weights: WeightsScheme | None


class QuantizationConfig(TypedDict):
    """``quantization_config`` of a compressed-tensors checkpoint (other keys are kept, unread)."""

    quant_method: str
    format: NotRequired[str | None]
    ignore: NotRequired[list[str] | None]
    config_groups: dict[str, ConfigGroup]


CONFIG_SCHEMA = schema_of(QuantizationConfig)


def _headers(root: Path) -> dict[str, tuple[Path, str, list[int]]]:
    out: dict[str, tuple[Path, str, list[int]]] = {}
    for f in sorted(root.glob("*.safetensors")):
        for name, t in read_header(f).tensors.items():
            out[name] = (f, t.dtype, list(t.shape))
    return out


def _weight_shape(path: Path, name: str) -> list[int]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return [int(v) for v in fh.get_tensor(name).reshape(-1).tolist()]


#: Suffixes of the tensors a quantized module stores beside (or instead of) its ``weight``.
_QUANTIZED = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_global_scale", "weight_g_idx")
_LEVELS = ("exact name", "pattern", "class")


def _match_level(module: str, target: str, quantized: bool) -> int | None:
    """How ``target`` matches ``module`` (0: its exact name, 1: a ``re:`` pattern, 2: a class), or None."""
    if target.startswith("re:"):
        return 1 if re.match(target[3:], module) else None
    if target == module:
        return 0
    is_class = "." not in target and target[:1].isupper()
    return 2 if is_class and quantized else None


def _group_level(module: str, group: ConfigGroup, quantized: bool) -> int | None:
    """The most specific way any of a group's targets matches ``module`` (None: none does)."""
    levels = [lvl for t in group.get("targets") or [] if (lvl := _match_level(module, t, quantized)) is not None]
    return min(levels, default=None)


def _modules(heads: dict[str, tuple[Path, str, list[int]]]) -> tuple[set[str], set[str]]:
    """Modules holding quantized tensors, and modules holding only a plain 2-D ``weight``."""
    quantized = {name.rsplit(".", 1)[0] for name in heads if name.rsplit(".", 1)[-1] in _QUANTIZED}
    plain = {name[: -len(".weight")] for name, (_p, _d, shape) in heads.items()
             if name.endswith(".weight") and len(shape) == 2} - quantized
    return quantized, plain


def _tensors_of(module: str, heads: dict[str, tuple[Path, str, list[int]]]) -> str:
    return ", ".join(f"{n.rsplit('.', 1)[-1]} {d} {s}" for n, (_p, d, s) in sorted(heads.items())
                     if n.rsplit(".", 1)[0] == module) or "nothing"


def check_compressed_tensors(root: Path) -> None:
    """Refuse a compressed-tensors checkpoint whose stored tensors contradict its configuration
    (docs/engines.md §"compressed-tensors checks"); other checkpoints pass untouched."""
    cfg_path = root / "config.json"
    cfg = read_json(cfg_path)
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
        return
    check(qc, CONFIG_SCHEMA, cfg_path, "quantization_config")
    config = cast(QuantizationConfig, qc)  # checked above
    groups = {k: g for k, g in config["config_groups"].items() if g.get("weights")}
    ignore: list[str] = config.get("ignore") or []
    heads = _headers(root)
    quantized, plain = _modules(heads)
    for module in sorted(quantized | plain):
        is_q = module in quantized
        first = next((heads[n][0] for n in sorted(heads) if n.rsplit(".", 1)[0] == module), cfg_path)
        ign = next((i for i, t in enumerate(ignore) if _match_level(module, t, False) is not None), None)
        if ign is not None:
            if is_q:
                raise VerificationError(first, f"{module} ({cfg_path.name} quantization_config.ignore[{ign}] {ignore[ign]!r})",
                                        "a plain weight (an ignored module is not quantized)", _tensors_of(module, heads))
            continue
        found = [(lvl, k) for k, g in groups.items() if (lvl := _group_level(module, g, is_q)) is not None]
        if not found:
            if is_q:
                raise VerificationError(first, f"{module} ({cfg_path.name} quantization_config.config_groups)",
                                        "a group whose targets match this quantized module", "none")
            continue
        best = min(lvl for lvl, _k in found)
        winners = sorted(k for lvl, k in found if lvl == best)
        if len(winners) > 1:
            raise VerificationError(cfg_path, f"quantization_config.config_groups targets matching {module}",
                                    f"one group (by {_LEVELS[best]})", f"{len(winners)}: {', '.join(winners)}")
        key = winners[0]
        fmt, w = groups[key].get("format") or config.get("format"), groups[key]["weights"]
        assert w is not None  # groups without weights were dropped above
        where = f"quantization_config.config_groups.{key}.weights"
        if not is_q:
            raise VerificationError(first, f"{module} ({cfg_path.name} {where}: {fmt}, matched by {_LEVELS[best]})",
                                    "quantized tensors", _tensors_of(module, heads))
        _check_module(module, fmt, w, where, heads, cfg_path)


def _check_module(module: str, fmt: str | None, w: WeightsScheme, where: str,
                  heads: dict[str, tuple[Path, str, list[int]]], cfg_path: Path) -> None:
    """One quantized module's tensors against the scheme ``w`` of format ``fmt`` (docs/engines.md §"compressed-tensors checks")."""
    bits, gsize, strategy = w["num_bits"], w.get("group_size"), w.get("strategy")
    scale = heads.get(f"{module}.weight_scale")
    packed, plain = heads.get(f"{module}.weight_packed"), heads.get(f"{module}.weight")
    if fmt in ("pack-quantized", "nvfp4-pack-quantized") and packed is None:
        raise VerificationError(cfg_path, f"{module} tensors ({where}: {fmt})", "weight_packed", _tensors_of(module, heads))
    if fmt in ("naive-quantized", "int-quantized", "float-quantized") and plain is None:
        raise VerificationError(cfg_path, f"{module} tensors ({where}: {fmt})", "weight and weight_scale", _tensors_of(module, heads))
    if fmt == "pack-quantized" and packed is not None:
        name, (path, dtype, shape) = f"{module}.weight_packed", packed
        if dtype != "I32":
            raise VerificationError(path, f"{name} dtype ({cfg_path.name} {where}: pack-quantized)", "I32", dtype)
        ws = heads.get(f"{module}.weight_shape")
        if ws is None:
            raise VerificationError(path, f"{module}.weight_shape", "present (pack-quantized)", "missing")
        out_f, in_f = (_weight_shape(ws[0], f"{module}.weight_shape") + [0, 0])[:2]
        want = [out_f, math.ceil(in_f * bits / 32)]
        if shape != want:
            raise VerificationError(path, f"{name} shape ({cfg_path.name} {where}.num_bits {bits}, weight_shape "
                                    f"[{out_f}, {in_f}])", want, shape)
        _check_scale(module, scale, strategy, gsize, out_f, in_f, where, cfg_path)
    elif fmt == "nvfp4-pack-quantized" and packed is not None:
        name, (path, dtype, shape) = f"{module}.weight_packed", packed
        if bits != 4:
            raise VerificationError(cfg_path, f"{where}.num_bits (nvfp4-pack-quantized)", 4, bits)
        if dtype != "U8" or len(shape) != 2:
            raise VerificationError(path, f"{name} dtype and rank (nvfp4-pack-quantized)", "U8 of rank 2", f"{dtype} {shape}")
        if scale is not None and gsize:
            want = [shape[0], math.ceil(2 * shape[1] / gsize)]
            if scale[2] != want:
                raise VerificationError(scale[0], f"{module}.weight_scale shape ({cfg_path.name} {where}.group_size "
                                        f"{gsize})", want, scale[2])
    elif fmt in ("naive-quantized", "int-quantized", "float-quantized") and plain is not None and scale is not None:
        name, (path, dtype, shape) = f"{module}.weight", plain
        if w.get("type", "int") == "float":
            if bits != 8 or dtype not in ("F8_E4M3", "F8_E5M2"):
                raise VerificationError(path, f"{name} dtype ({cfg_path.name} {where}.num_bits {bits}, {fmt})",
                                        "F8_E4M3 or F8_E5M2 with num_bits 8", f"{dtype} with num_bits {bits}")
        elif bits > 8 or dtype != "I8":
            raise VerificationError(path, f"{name} dtype ({cfg_path.name} {where}.num_bits {bits}, int, {fmt})",
                                    "I8 with num_bits <= 8", f"{dtype} with num_bits {bits}")
        if len(shape) == 2:
            _check_scale(module, scale, strategy, gsize, shape[0], shape[1], where, cfg_path)


def _check_scale(module: str, scale: tuple[Path, str, list[int]] | None, strategy: str | None, gsize: int | None,
                 out_f: int, in_f: int, where: str, cfg_path: Path) -> None:
    """A ``channel`` scale is ``[out, 1]``, a ``group`` one ``[out, ceil(in / group_size)]``."""
    if scale is None or strategy not in ("group", "channel"):
        return
    cols = math.ceil(in_f / gsize) if strategy == "group" and gsize else 1
    if scale[2] != [out_f, cols]:
        raise VerificationError(scale[0], f"{module}.weight_scale shape ({cfg_path.name} {where}: "
                                f"{strategy}, group_size {gsize})", [out_f, cols], scale[2])
