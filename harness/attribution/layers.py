"""One-pass per-layer error (``fidelity layers``): where a candidate's hidden states leave the reference's.

For a few contexts, the reference and the candidate run in one process and compute dtype; every decoder
layer's output and every linear module's output are compared **free-running** (each model on its own),
**teacher-forced** (each candidate layer fed the reference's input to it) and **per module** (each linear
module fed the reference's input, pooled by module kind), as ``rel_frobenius`` = ‖c − r‖_F / ‖r‖_F,
``cosine_error`` = 1 − mean cos(r_t, c_t) and ``sqnr_db`` = 10 log10(‖r‖² / ‖c − r‖²) (None when equal).
``by_kind`` and ``by_layer_type`` pool the sums of their members (``cosine_error``: the members' mean).
These are distances of hidden states, not effects on the output distribution (``fidelity attribute``
measures those): docs/diagnostics.md, "Where hidden states leave the reference"; docs/hybrid.md, "By layer type".
The JSON (schema :data:`SCHEMA`) is the TypedDicts below.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch

from harness.engines.identity import model_identity
from harness.engines.transformers import load_model, parse_dtype
from harness.errors import FidelityError, VerificationError
from harness.inputs.suite import Suite

__all__ = ["SCHEMA", "ErrorStats", "LayerRow", "ModuleRow", "KindRow", "LayerTypeRow", "ErrorSums", "layer_errors",
           "layer_types"]

SCHEMA = "fidelity.layer-errors/1"


class ErrorStats(TypedDict):
    """Distances of the candidate's vectors from the reference's (module docstring)."""

    rel_frobenius: float
    cosine_error: float
    sqnr_db: float | None  # None: identical


class LayerRow(TypedDict):
    """One decoder layer: its output's error free-running and teacher-forced."""

    layer: int
    layer_type: str
    teacher_forced: ErrorStats
    free_running: ErrorStats


class ModuleRow(ErrorStats):
    """One linear module, teacher-forced (fed the reference's input)."""

    layer: int
    kind: str
    name: str


class KindRow(ErrorStats):
    """All modules of one kind, pooled."""

    kind: str
    n_modules: int


class LayerTypeRow(ErrorStats):
    """All decoder layers of one type (``linear_attention``, ``full_attention``, ...), teacher-forced, pooled."""

    layer_type: str
    n_layers: int
    layers: list[int]


@dataclass
class ErrorSums:
    """Additive sums over positions: ‖r‖², ‖c − r‖², Σ cos(r_t, c_t) and the position count."""

    ref_sq: float = 0.0
    err_sq: float = 0.0
    cos_sum: float = 0.0
    rows: int = 0

    def add(self, r: torch.Tensor, c: torch.Tensor) -> None:
        r2 = r.reshape(-1, r.shape[-1]).double()
        c2 = c.reshape(-1, c.shape[-1]).double()
        self.ref_sq += float((r2 * r2).sum())
        self.err_sq += float(((c2 - r2) ** 2).sum())
        self.cos_sum += float(torch.nn.functional.cosine_similarity(r2, c2, dim=1, eps=1e-30).sum())
        self.rows += int(r2.shape[0])

    def stats(self) -> ErrorStats:
        return {"rel_frobenius": math.sqrt(self.err_sq / self.ref_sq) if self.ref_sq > 0 else 0.0,
                "cosine_error": 1.0 - self.cos_sum / self.rows if self.rows else 0.0,
                "sqnr_db": 10.0 * math.log10(self.ref_sq / self.err_sq) if self.err_sq > 0 and self.ref_sq > 0 else None}


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers: the ``ModuleList`` named ``...layers`` with ``num_hidden_layers`` entries."""
    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and name.split(".")[-1] == "layers" and (n is None or len(mod) == n):
            return list(mod)
    raise FidelityError(f"{type(model).__name__}: no decoder layer list (a ModuleList named 'layers' of num_hidden_layers)")


def layer_types(model: torch.nn.Module, n: int) -> list[str]:
    """Each decoder layer's type from ``config.layer_types`` (hybrid models); ``decoder`` for every layer without it."""
    types = getattr(getattr(model, "config", None), "layer_types", None)
    if isinstance(types, (list, tuple)) and len(types) == n:
        return [str(t) for t in types]
    return ["decoder"] * n


def linear_modules(layer: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The linear modules of a decoder layer (``nn.Linear`` and subclasses, e.g. compressed-tensors' modules),
    and a mixture of experts' router (``mlp.gate``: its logits are compared) and routed experts stored fused
    (``mlp.experts``, 3-D tensors: fed the reference's input *and routing*, so the error is their weights')."""
    return [(n, m) for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear) or _moe_module(n, m)]


def _moe_module(name: str, module: torch.nn.Module) -> bool:
    if name.endswith("mlp.gate"):
        return hasattr(module, "top_k")
    return name.endswith("mlp.experts") and any(p.ndim == 3 for p in module.parameters(recurse=False))


def module_kind_of(name: str) -> str:
    """A module's kind in the per-module table: its own name; for a mixture of experts ``router``
    (``mlp.gate``), ``experts`` (the routed experts) and ``shared_expert.<proj>``."""
    if name.endswith("mlp.gate"):
        return "router"
    parts = name.split(".")
    return f"shared_expert.{parts[-1]}" if len(parts) > 1 and parts[-2] == "shared_expert" else parts[-1]


def _out(o: Any) -> torch.Tensor:
    t = o[0] if isinstance(o, tuple) else o
    if not isinstance(t, torch.Tensor):
        raise FidelityError(f"a decoder layer returned {type(t).__name__}; expected a tensor (or a tuple starting with one)")
    return t


@contextmanager
def _hooks(handles: list[Any]) -> Iterator[None]:
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _record(mods: list[torch.nn.Module], inputs: list[Any] | None, outputs: list[Any]) -> list[Any]:
    """Hooks that store each module's input (first positional or ``hidden_states``) and output."""
    handles = []
    for i, m in enumerate(mods):
        if inputs is not None:
            def pre(_m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], i: int = i) -> None:
                inputs[i] = (args[0] if args else kwargs["hidden_states"]).detach()
            handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))

        def post(_m: torch.nn.Module, _a: Any, o: Any, i: int = i) -> None:
            outputs[i] = _out(o).detach()
        handles.append(m.register_forward_hook(post))
    return handles


def _force(mods: list[torch.nn.Module], given: list[Any], outputs: list[Any]) -> list[Any]:
    """Hooks that feed each module the given input (the reference's) and store its output."""
    handles = []
    for i, m in enumerate(mods):
        def pre(_m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], i: int = i) -> Any:
            if args:
                return (given[i],) + tuple(args[1:]), kwargs
            return args, {**kwargs, "hidden_states": given[i]}
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))

        def post(_m: torch.nn.Module, _a: Any, o: Any, i: int = i) -> None:
            outputs[i] = _out(o).detach()
        handles.append(m.register_forward_hook(post))
    return handles


def _load(path: Path, dtype: torch.dtype, device: str) -> torch.nn.Module:
    model = load_model(path, device="cpu", dtype="bfloat16")
    return model.to(device, dtype).eval()


def layer_errors(reference: str | Path, candidate: str | Path, suite_path: str | Path, *, shards: str | None = None,
                 contexts: int = 4, dtype: str = "float32", device: str = "cpu") -> dict[str, Any]:
    """Per-layer and per-module errors of ``candidate`` against ``reference`` (module docstring)."""
    if contexts < 1:
        raise FidelityError(f"--contexts: expected >= 1, found {contexts}")
    t0 = time.perf_counter()
    suite = Suite.load(suite_path, verify=True)
    indices = suite.context_indices(suite.parse_shards(shards))[:contexts]
    tdtype = parse_dtype(dtype)
    ref_model = _load(Path(reference), tdtype, device)
    cand_model = _load(Path(candidate), tdtype, device)
    r_layers, c_layers = decoder_layers(ref_model), decoder_layers(cand_model)
    if len(r_layers) != len(c_layers):
        raise VerificationError(Path(candidate) / "config.json", "decoder layers", len(r_layers), len(c_layers))
    r_mods = [(li, n, m) for li, L in enumerate(r_layers) for n, m in linear_modules(L)]
    c_mods = [(li, n, m) for li, L in enumerate(c_layers) for n, m in linear_modules(L)]
    if [(li, n) for li, n, _ in r_mods] != [(li, n) for li, n, _ in c_mods]:
        raise VerificationError(Path(candidate), "linear modules of the decoder layers", [n for _, n, _ in r_mods][:7],
                                [n for _, n, _ in c_mods][:7], "the two models differ in structure")
    nl, nm = len(r_layers), len(r_mods)
    tf = [ErrorSums() for _ in range(nl)]
    free = [ErrorSums() for _ in range(nl)]
    mod = [ErrorSums() for _ in range(nm)]
    t1 = time.perf_counter()
    with torch.inference_mode():
        for ci in indices:
            ids = torch.as_tensor(np.asarray(suite.tokens[[ci]], dtype=np.int64), device=device)
            l_in: list[Any] = [None] * nl
            l_out: list[Any] = [None] * nl
            m_in: list[Any] = [None] * nm
            m_out: list[Any] = [None] * nm
            with _hooks(_record(r_layers, l_in, l_out) + _record([m for _, _, m in r_mods], m_in, m_out)):
                ref_model(input_ids=ids, use_cache=False)
            got: list[Any] = [None] * nl
            with _hooks(_record(c_layers, None, got)):
                cand_model(input_ids=ids, use_cache=False)
            for i in range(nl):
                free[i].add(l_out[i], got[i])
            got = [None] * nl
            with _hooks(_force(c_layers, l_in, got)):
                cand_model(input_ids=ids, use_cache=False)
            for i in range(nl):
                tf[i].add(l_out[i], got[i])
            got_m: list[Any] = [None] * nm
            with _hooks(_force([m for _, _, m in c_mods], m_in, got_m)):
                cand_model(input_ids=ids, use_cache=False)
            for j in range(nm):
                mod[j].add(m_out[j], got_m[j])
    t2 = time.perf_counter()
    types = layer_types(ref_model, nl)
    layers: list[LayerRow] = [{"layer": i, "layer_type": types[i], "teacher_forced": tf[i].stats(),
                               "free_running": free[i].stats()} for i in range(nl)]
    by_type: list[LayerTypeRow] = []
    for t in dict.fromkeys(types):
        idx = [i for i in range(nl) if types[i] == t]
        pooled_t = ErrorSums(sum(tf[i].ref_sq for i in idx), sum(tf[i].err_sq for i in idx),
                             sum(tf[i].cos_sum for i in idx), sum(tf[i].rows for i in idx)).stats()
        pooled_t["cosine_error"] = float(np.mean([layers[i]["teacher_forced"]["cosine_error"] for i in idx]))
        by_type.append({"layer_type": t, "n_layers": len(idx), "layers": idx, **pooled_t})
    modules: list[ModuleRow] = [{"layer": li, "kind": module_kind_of(n), "name": n, **mod[j].stats()}
                                for j, (li, n, _) in enumerate(r_mods)]
    by_kind: list[KindRow] = []
    for kind in dict.fromkeys(r["kind"] for r in modules):
        js = [j for j, r in enumerate(modules) if r["kind"] == kind]
        pooled = ErrorSums(sum(mod[j].ref_sq for j in js), sum(mod[j].err_sq for j in js),
                           sum(mod[j].cos_sum for j in js), sum(mod[j].rows for j in js)).stats()
        pooled["cosine_error"] = float(np.mean([modules[j]["cosine_error"] for j in js]))
        by_kind.append({"kind": kind, "n_modules": len(js), **pooled})
    return {
        "schema": SCHEMA,
        "reference": {"path": str(reference), "identity": model_identity(reference)},
        "candidate": {"path": str(candidate), "identity": model_identity(candidate)},
        "suite": {"path": str(suite_path), "suite_token_sha256": suite.suite_token_sha256, "contexts": [int(i) for i in indices]},
        "compute": {"dtype": dtype, "device": device},
        "n_positions": int(len(indices) * suite.n_ctx),
        "layers": layers,
        "by_layer_type": by_type,
        "modules": modules,
        "by_kind": by_kind,
        "ranking": sorted(range(nl), key=lambda i: -layers[i]["teacher_forced"]["rel_frobenius"]),
        "timing": {"load_s": t1 - t0, "forward_s": t2 - t1, "total_s": time.perf_counter() - t0},
    }
