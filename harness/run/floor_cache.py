"""The precision floor beside every ladder: measured once per reference, suite, shards and window, kept in
the capture cache under its signature.

Which contexts: every context of the run's shards while ``parameters x positions`` stays within
:data:`FLOOR_BUDGET`; beyond it, an evenly spaced sample of them (at least :data:`MIN_SAMPLE`), stated in
the result's ``sample`` with its interval (the cluster bootstrap of the sampled contexts). The forward is
float64 up to :data:`FLOAT64_MAX_PARAMS` parameters (8 bytes each), float32 above.

Reasoning: docs/statistics.md §"The precision floor beside the ladder".
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

from harness.attribution.sizes import folder_tensor_bytes
from harness.capture.cache_sign import UntrustedCacheWarning, sign, unsigned_reason
from harness.capture.store import CaptureStore
from harness.engines.identity import model_identity
from harness.inputs.config import FidelityConfig
from harness.inputs.head import load_head
from harness.inputs.suite import Suite
from harness.io.atomic import atomic_write_files, dumps_json
from harness.io.hashing import sha256_bytes
from harness.io.jsonio import JSONObject
from harness.run.precision_floor import SCHEMA, PrecisionFloor, precision_floor

__all__ = ["FLOAT64_MAX_PARAMS", "FLOOR_BUDGET", "FLOOR_N_BOOT", "MIN_SAMPLE", "floor_contexts", "floor_for_run"]

#: parameters x scored positions measured in full; a float64 forward costs about twice this in FLOPs
FLOOR_BUDGET = 5e11
#: the fewest contexts a sample measures
MIN_SAMPLE = 24
#: above this many parameters the forward runs in float32 (float64 weights take 8 bytes per parameter)
FLOAT64_MAX_PARAMS = 2e9
#: the floor's bootstrap replicates, whatever the configuration's n_boot (one cached floor serves every ladder)
FLOOR_N_BOOT = 10_000


def floor_contexts(suite: Suite, shards: str | None, params: int) -> tuple[list[int], JSONObject | None]:
    """The contexts the floor measures and, for a sample, how they were chosen (docs/statistics.md §"The floor's cache")."""
    indices = suite.context_indices(suite.parse_shards(shards))
    rows = suite.n_ctx - 1
    if params * len(indices) * rows <= FLOOR_BUDGET:
        return indices, None
    n = min(len(indices), max(MIN_SAMPLE, int(FLOOR_BUDGET // (params * rows))))
    if n == len(indices):
        return indices, None
    step = len(indices) / n
    picked = [indices[int(i * step)] for i in range(n)]
    text = (f"a sample of {n} of the shards' {len(indices)} contexts, every {step:.2f}th in suite order "
            f"({params} parameters x {len(indices) * rows} positions exceeds the budget {FLOOR_BUDGET:.0e}); "
            "its interval is the cluster bootstrap of the sampled contexts")
    return picked, {"text": text, "n_sampled": n, "n_contexts": len(indices), "budget": FLOOR_BUDGET, "params": params}


def _params(model_dir: Path) -> int:
    """Parameters of a plain bf16/fp16 reference folder, from its tensor table (2 bytes each)."""
    return sum(folder_tensor_bytes(model_dir).values()) // 2


def floor_for_run(config: FidelityConfig, *, shards: str | None, score_from: int,
                  key: bytes) -> tuple[PrecisionFloor | None, str]:
    """The run's floor (cached or measured now) and one line saying where it came from, or None and why not."""
    ref = config.reference
    if ref.model is None or not Path(ref.model).is_dir():
        return None, "precision floor: not measured (the reference has no model folder to run in float64)"
    suite = Suite.load(config.suite, verify=False)
    store = CaptureStore.open(ref.store, suite)
    if store.kind != "hidden_states":
        return None, f"precision floor: not measured (the reference store holds {store.kind}, not hidden states)"
    params = _params(Path(ref.model))
    contexts, sample = floor_contexts(suite, shards, params)
    dtype = "float64" if params <= FLOAT64_MAX_PARAMS else "float32"
    ident: JSONObject = {"schema": SCHEMA, "reference": store.identity, "model": model_identity(ref.model),
                         "head": load_head(ref.head).sha256, "suite": suite.suite_token_sha256, "shards": shards,
                         "score_from": score_from, "contexts": list(contexts), "dtype": dtype, "n_boot": FLOOR_N_BOOT}
    digest = sha256_bytes(json.dumps(ident, sort_keys=True).encode())[:32]
    path = Path(config.cache_dir) / "precision-floor" / f"{digest}.json"
    if path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = None
        why = "unreadable JSON" if not isinstance(doc, dict) else unsigned_reason(doc, key)
        if why is None and isinstance(doc, dict) and doc.get("cache_identity") == ident:
            doc.pop("cache_signature")
            doc.pop("cache_identity")
            return doc, f"precision floor: from the cache ({path})"  # type: ignore[return-value]
        warnings.warn(UntrustedCacheWarning(f"{path}: not believed ({why or 'another identity'}); measured again"),
                      stacklevel=2)
    t0 = time.perf_counter()
    result = precision_floor(suite_path=config.suite, model_dir=ref.model, store_path=ref.store, head_path=ref.head,
                             shards=shards, dtype=dtype, n_boot=FLOOR_N_BOOT, contexts=contexts, score_from=score_from)
    if sample is not None:
        result["sample"] = sample
    signed = sign({**result, "cache_identity": ident}, key)
    atomic_write_files({path: dumps_json(signed)})
    return result, f"precision floor: measured in {time.perf_counter() - t0:.1f} s ({dtype}), cached at {path}"
