"""A family of per-unit quantization choices: effective weights, bytes, and how to build a layout.

* :class:`ProjectFamily` -- the project's own format (:mod:`harness.allocation.project_format`): the effective
  weight of a choice is the dequantized weight its loader gives; a layout is built as one checkpoint folder.
* :class:`GgufFamily` -- GGUF through llama.cpp (:mod:`harness.allocation.gguf_format`): each choice's effective
  weights and bytes are read back from a file llama.cpp wrote with every unit at that type (a unit's tensor
  does not depend on the others' types: no importance matrix), so they are what llama.cpp really writes,
  fallbacks included; a layout is built as one ``.gguf`` with a type override per unit.

A *layout* maps every unit to a choice. ``fixed_bytes`` are the stored bytes a layout does not choose (the
embedding, norms); a layout's bytes are ``fixed_bytes`` plus its units' bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from harness.allocation.choices import LINEARS, parse_project
from harness.allocation.gguf_format import gguf_name, quantize, types_and_bytes, unit_weights
from harness.attribution.sizes import folder_tensor_bytes
from harness.engines.quant_manifest import layer_recipe, read_quant
from harness.errors import FidelityError, VerificationError

if TYPE_CHECKING:
    from types import ModuleType


def _pf() -> ModuleType:
    """:mod:`harness.allocation.project_format`, imported on first use (it loads torch and safetensors)."""
    from harness.allocation import project_format

    return project_format


class Family(Protocol):
    """What the search needs of a family of choices (module docstring)."""

    name: str
    choices: list[str]
    units: list[str]
    fixed_bytes: int

    def weight(self, unit: str, choice: str) -> np.ndarray:
        """The float32 ``[out, in]`` weight the unit has under ``choice``."""
        ...

    def unit_bytes(self, unit: str, choice: str) -> int:
        """Stored bytes of the unit under ``choice``."""
        ...

    def build(self, layout: Mapping[str, str], out: Path) -> Path:
        """Write the layout as a candidate under ``out``; returns the model path (folder or file)."""
        ...

    def built_bytes(self, model: Path) -> int:
        """The stored tensor bytes of a built candidate, read back from its files."""
        ...

    def base_layout(self, base: str) -> dict[str, str]:
        """``base``: a choice (every unit at it) or a candidate of this family (the choices it holds)."""
        ...


def layout_bytes(family: Family, layout: Mapping[str, str]) -> int:
    """Predicted stored bytes of a layout."""
    return family.fixed_bytes + sum(family.unit_bytes(u, c) for u, c in layout.items())


def _check_base(family: Family, layout: dict[str, str], where: str) -> dict[str, str]:
    missing = sorted(set(family.units) - set(layout))
    if missing:
        raise VerificationError(where, "units of the base layout", "every quantized linear", f"missing {missing[:3]}")
    bad = sorted({c for c in layout.values() if c not in family.choices})
    if bad:
        raise FidelityError(f"{where}: the base layout uses {', '.join(bad)}, which the choices "
                            f"({', '.join(family.choices)}) do not include: add them")
    return {u: layout[u] for u in family.units}


class ProjectFamily:
    """The project's format over the reference checkpoint's decoder-layer linears."""

    name = "project"

    def __init__(self, reference: Path, choices: list[str]) -> None:
        self.reference = Path(reference)
        self.choices = choices
        self.source = _pf().source_tensors(self.reference)
        self.units = sorted(k.removesuffix(".weight") for k in self.source
                            if k.endswith(".weight") and k.removesuffix(".weight").rsplit(".", 1)[-1] in LINEARS)
        if not self.units:
            raise FidelityError(f"{self.reference}: no decoder-layer linear weights ({', '.join(LINEARS)}) to quantize")
        self.fixed_bytes = int(_pf().fixed_bytes(self.source, set(self.units)))
        self._w: dict[tuple[str, str], np.ndarray] = {}

    def _ref(self, unit: str) -> np.ndarray:
        out: np.ndarray = self.source[unit + ".weight"].double().numpy()
        return out

    def weight(self, unit: str, choice: str) -> np.ndarray:
        key = (unit, choice)
        if key not in self._w:
            self._w[key] = _pf().effective(self._ref(unit), parse_project(choice))
        return self._w[key]

    def unit_bytes(self, unit: str, choice: str) -> int:
        shape = tuple(self.source[unit + ".weight"].shape)
        return int(_pf().unit_bytes((int(shape[0]), int(shape[1])), parse_project(choice)))

    def build(self, layout: Mapping[str, str], out: Path) -> Path:
        counts: dict[str, int] = {}
        for c in layout.values():
            counts[c] = counts.get(c, 0) + 1
        base = max(sorted(counts), key=lambda c: counts[c])
        _pf().build(self.reference, out, layout, base)
        return out

    def built_bytes(self, model: Path) -> int:
        return sum(folder_tensor_bytes(model).values())

    def base_layout(self, base: str) -> dict[str, str]:
        path = Path(base)
        if not path.is_dir():
            return {u: parse_project(base).name for u in self.units}

        q = read_quant(path)
        if q["code_kind"] != "int" or not str(q["method"]).startswith("rtn_sym"):
            raise FidelityError(f"{path}: a base layout of the project family must be symmetric round-to-nearest "
                                f"integers (method rtn_sym_*, code_kind int), found {q['method']} / {q['code_kind']}")
        layout = {}
        for u in q["layers"]:
            r = layer_recipe(q, u)
            layout[u] = f"int{r['bits']}" + (f"_g{r['group_size']}" if r["group_size"] else "")
        return _check_base(self, layout, str(path))


class GgufFamily:
    """GGUF types per unit, quantized by llama.cpp from a BF16 GGUF (``work``: where the per-type files go)."""

    name = "gguf"

    def __init__(self, reference: Path, bf16_gguf: Path, choices: list[str], work: Path, *,
                 token_embedding_type: str = "Q8_0", threads: int = 1) -> None:
        self.reference, self.bf16_gguf, self.work = Path(reference), Path(bf16_gguf), Path(work)
        self.choices, self.token_embedding_type, self.threads = choices, token_embedding_type, threads
        source = _pf().source_tensors(self.reference)
        self.units = sorted(k.removesuffix(".weight") for k in source
                            if k.endswith(".weight") and k.removesuffix(".weight").rsplit(".", 1)[-1] in LINEARS)
        self._weights: dict[str, dict[str, tuple[str, np.ndarray]]] = {}
        self._bytes: dict[str, dict[str, int]] = {}
        self.written_types: dict[str, dict[str, str]] = {}
        first = self._uniform(choices[0])

        _, nbytes = types_and_bytes(first)
        unit_names = {gguf_name(u) for u in self.units}
        self.fixed_bytes = sum(b for n, b in nbytes.items() if n not in unit_names)

    def _uniform(self, choice: str) -> Path:
        path = self.work / f"uniform-{choice.lower()}.gguf"
        if choice not in self._weights:
            quantize(self.bf16_gguf, path, {u: choice for u in self.units},
                     token_embedding_type=self.token_embedding_type, threads=self.threads)
            self._weights[choice] = unit_weights(path, self.units)
            _, nbytes = types_and_bytes(path)
            self._bytes[choice] = {u: nbytes[gguf_name(u)] for u in self.units}
            self.written_types[choice] = {u: t for u, (t, _) in self._weights[choice].items()}
        return path

    def weight(self, unit: str, choice: str) -> np.ndarray:
        self._uniform(choice)
        return self._weights[choice][unit][1]

    def unit_bytes(self, unit: str, choice: str) -> int:
        self._uniform(choice)
        return self._bytes[choice][unit]

    def build(self, layout: Mapping[str, str], out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        return quantize(self.bf16_gguf, out / "model.gguf", layout, token_embedding_type=self.token_embedding_type,
                        threads=self.threads)

    def built_bytes(self, model: Path) -> int:
        return sum(types_and_bytes(model)[1].values())

    def base_layout(self, base: str) -> dict[str, str]:
        path = Path(base)
        if not path.is_file():
            return {u: base.upper() for u in self.units}

        types, _ = types_and_bytes(path)
        layout = {u: types[gguf_name(u)] for u in self.units if gguf_name(u) in types}
        return _check_base(self, layout, str(path))
