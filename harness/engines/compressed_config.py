"""A compressed-tensors checkpoint's ``quantization_config`` checked against its stored tensors, before any
engine loads it.

compressed-tensors believes the configuration: a checkpoint whose ``num_bits`` says 3 while its tensors are
packed 4 bits a value loads without a word and computes with garbage weights. The harness reads the
configuration the way compressed-tensors does and refuses, naming the file, the tensor, the expected and the
found value, where the stored tensors contradict it:

* ``pack-quantized`` (integers packed into int32): ``weight_packed`` is ``I32`` of shape
  ``[out, ceil(in * num_bits / 32)]`` where ``weight_shape`` holds ``[out, in]``; a ``group`` strategy's
  ``weight_scale`` is ``[out, ceil(in / group_size)]``, a ``channel`` one ``[out, 1]``;
* ``nvfp4-pack-quantized`` (two 4-bit floats a byte): ``num_bits`` 4, ``weight_packed`` ``U8``, and
  ``weight_scale`` ``[out, 2 * packed columns / group_size]``;
* ``float-quantized`` with 8 bits: ``weight`` is ``F8_E4M3`` or ``F8_E5M2``.

Only the safetensors headers are read (and the two integers of each ``weight_shape``). A configuration of
several schemes (different bits per group of modules) is left to compressed-tensors.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from harness.errors import VerificationError
from harness.io.jsonio import read_json
from harness.io.schema import MapOf, Nullable, Optional, check

#: What the check reads of ``quantization_config`` (harness.io.schema).
CONFIG_SCHEMA = {
    "quant_method": str,
    "format": Optional(str),
    "config_groups": MapOf({"format": Optional(Nullable(str)),
                            "weights": Nullable({"num_bits": int, "group_size": Optional(Nullable(int)),
                                                 "strategy": Optional(Nullable(str)), "type": Optional(str)})}),
}


def _headers(root: Path) -> dict[str, tuple[Path, str, list[int]]]:
    out: dict[str, tuple[Path, str, list[int]]] = {}
    for f in sorted(root.glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                head = json.loads(fh.read(min(n, 100 * 2**20)).decode("utf-8"))
        except (OSError, ValueError, struct.error) as e:
            raise VerificationError(f, "safetensors header", "a readable header", f"{type(e).__name__}: {e}") from None
        if not isinstance(head, dict):
            raise VerificationError(f, "safetensors header", "a JSON object", type(head).__name__)
        for name, spec in head.items():
            if name != "__metadata__" and isinstance(spec, dict):
                out[name] = (f, str(spec.get("dtype")), list(spec.get("shape") or []))
    return out


def _weight_shape(path: Path, name: str) -> list[int]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return [int(v) for v in fh.get_tensor(name).reshape(-1).tolist()]


def check_compressed_tensors(root: Path) -> None:
    """Refuse a compressed-tensors checkpoint whose stored tensors contradict its configuration (module
    docstring); other checkpoints pass untouched."""
    cfg_path = root / "config.json"
    cfg = read_json(cfg_path)
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
        return
    check(qc, CONFIG_SCHEMA, cfg_path, "quantization_config")
    groups = [(k, g) for k, g in qc["config_groups"].items() if g.get("weights")]
    schemes = {(g.get("format") or qc.get("format"), json.dumps(g["weights"], sort_keys=True)) for _k, g in groups}
    if len(schemes) != 1:
        return
    key, group = groups[0]
    fmt, w = group.get("format") or qc.get("format"), group["weights"]
    where = f"quantization_config.config_groups.{key}.weights"
    bits, gsize, strategy = w["num_bits"], w.get("group_size"), w.get("strategy")
    heads = _headers(root)
    for name, (path, dtype, shape) in sorted(heads.items()):
        module = name.rsplit(".", 1)[0]
        scale = heads.get(f"{module}.weight_scale")
        if fmt == "pack-quantized" and name.endswith(".weight_packed"):
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
            if scale is not None and strategy in ("group", "channel"):
                cols = math.ceil(in_f / gsize) if strategy == "group" and gsize else 1
                if scale[2] != [out_f, cols]:
                    raise VerificationError(scale[0], f"{module}.weight_scale shape ({cfg_path.name} {where}: "
                                            f"{strategy}, group_size {gsize})", [out_f, cols], scale[2])
        elif fmt == "nvfp4-pack-quantized" and name.endswith(".weight_packed"):
            if bits != 4:
                raise VerificationError(cfg_path, f"{where}.num_bits (nvfp4-pack-quantized)", 4, bits)
            if dtype != "U8" or len(shape) != 2:
                raise VerificationError(path, f"{name} dtype and rank (nvfp4-pack-quantized)", "U8 of rank 2", f"{dtype} {shape}")
            if scale is not None and gsize:
                want = [shape[0], math.ceil(2 * shape[1] / gsize)]
                if scale[2] != want:
                    raise VerificationError(scale[0], f"{module}.weight_scale shape ({cfg_path.name} {where}.group_size "
                                            f"{gsize})", want, scale[2])
        elif fmt == "float-quantized" and name.endswith(".weight") and scale is not None:
            if bits != 8 or dtype not in ("F8_E4M3", "F8_E5M2"):
                raise VerificationError(path, f"{name} dtype ({cfg_path.name} {where}.num_bits {bits}, float-quantized)",
                                        "F8_E4M3 or F8_E5M2 with num_bits 8", f"{dtype} with num_bits {bits}")

