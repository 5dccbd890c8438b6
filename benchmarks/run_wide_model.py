"""A whole run at 27B widths on a CPU, both ways of keeping a candidate: store-then-score and score-while-capturing.

Built at benchmark time in ``--work`` (never committed): a randomly initialised ``Qwen3ForCausalLM``
with the seed suite's widths -- hidden 5,120, vocabulary 248,320, ``--layers`` decoder layers
(default 1; intermediate 17,408, 40 query / 8 key-value heads of 128), untied LM head, bf16 -- as
the reference; a candidate with the same weights except the decoder layers' linear weights rounded
to int8 (per-output-row absmax, round to nearest: a W8 RTN quantization); a word-level tokenizer
with 248,320 ids; a corpus of random words cut into ``--contexts`` contexts of ``--n-ctx`` tokens
(one shard); the shared head exported from the reference. Weights are drawn a block of rows at a
time into an uninitialised bf16 model, so the build holds one model and no fp32 copy of it.

Then, each stage in its own child process (its peak resident memory is that process's ``ru_maxrss``):

* ``capture``  -- both models through engine ``transformers`` into capture stores (the shared
  capture loop: the model's identity by content -- its weight files hashed --, load, forward,
  bf16 rows, safetensors write, sha256); identity, load and forward are timed inside the
  engine, the rest of the loop is "store write + hash";
* ``verify``   -- both stores opened and every context loaded (each file re-hashed and checked),
  and the reference model's identity by content (its weight files hashed) timed on its own;
* ``score``    -- the shard's positions through the shared head (``shard_positions``: the exact scorer);
* ``report``   -- statistics (10,000-replicate bootstrap) and the shard report written (JSON + Markdown);
* ``stream``   -- score-while-capturing (``keep = "scores"``, ``harness.run.live_scores.capture_scored``):
  the candidate loaded through the same engine, its rows scored in memory tile by tile against the
  reference store's rows as they come (never written), the statistics, and what the mode keeps: the
  signed scored tiles (``.npz``) and the metrics; the scores are compared with the store-then-score ones.

    nice -n 5 python benchmarks/run_wide_model.py --work /tmp/wide --contexts 2 --n-ctx 512 --json wide.json

The machine kind is the process's: ``ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` in the
environment runs every stage as on an AVX2-only CPU (``--stages capture,verify,score,stream`` reuses a
build). Disk: ~5.8 GB per model folder, 20.96 MB per stored 2,048-token context; memory: the model,
the 2.5 GB head and the scorer's tiles (``stream`` holds all three at once).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, VOCAB, N_CTX = 5120, 248_320, 2048  # N_CTX: the seed suite's context length
INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 17_408, 40, 8, 128


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- stages (children)


def _random_model(cfg: Any, seed: int = 0) -> Any:
    """An uninitialised bf16 model, its weights drawn ``normal(0, initializer_range)`` a block of rows at a
    time (norms 1): never an fp32 copy of a 248,320 x 5,120 matrix (``normal_`` on a whole bf16 parameter
    takes one)."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.set_default_dtype(torch.bfloat16)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(cfg)  # type: ignore[no-untyped-call]
    torch.set_default_dtype(torch.float32)
    model = model.to_empty(device="cpu").eval()  # type: ignore[no-untyped-call]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.fill_(1.0)
                continue
            for r0 in range(0, p.shape[0], 8192):
                p[r0 : r0 + 8192].normal_(0.0, cfg.initializer_range, generator=g)
    return model


def stage_build(work: Path, layers: int, contexts: int, n_ctx: int, candidate: bool = True) -> dict[str, Any]:
    import numpy as np
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Qwen3Config

    from harness.inputs.head import export_head
    from harness.inputs.suite import build_suite

    t0 = time.perf_counter()
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(work / "tokenizer.json"))
    rng = np.random.default_rng(0)
    corpus = work / "corpus" / "prose"
    corpus.mkdir(parents=True, exist_ok=True)
    for d in range(contexts):  # one document (one source cluster) per context
        ids = rng.integers(0, VOCAB, n_ctx + 7)
        (corpus / f"doc{d:03d}.txt").write_text(" ".join(f"w{i}" for i in ids), "utf-8")
    suite = build_suite(work / "corpus", work / "tokenizer.json", n_ctx=n_ctx, n_contexts=contexts, n_shards=1, seed=0,
                        out=work / "suite")
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=layers,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                      max_position_embeddings=max(n_ctx, N_CTX), tie_word_embeddings=False)
    model = _random_model(cfg)
    t_init = time.perf_counter()
    model.save_pretrained(work / "reference", safe_serialization=True, max_shard_size="2GB")
    if candidate:
        with torch.no_grad():  # W8 RTN of every decoder linear weight
            for name, p in model.named_parameters():
                if name.startswith("model.layers.") and p.ndim == 2:
                    scale = p.float().abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
                    p.copy_((p.float() / scale).round().clamp(-127, 127).mul(scale).to(p.dtype))
        model.save_pretrained(work / "candidate", safe_serialization=True, max_shard_size="2GB")
    del model
    export_head(work / "reference", work / "lm_head.safetensors")
    return {"seconds": time.perf_counter() - t0, "init_s": t_init - t0, "contexts": suite.n_contexts, "n_ctx": n_ctx,
            "model_bytes": _dir_bytes(work / "reference")}


def _timing_patches(engine: str) -> dict[str, list[float]]:
    """Wrap the engine's identity, load and forward with timers; returns the running totals (seconds)."""
    from harness.engines import transformers as T
    from harness.engines import vllm as V

    loaded_cls, engine_cls = (T.TransformersLoaded, T.TransformersEngine) if engine == "transformers" else (V.VllmLoaded, V.VllmEngine)
    spent: dict[str, list[float]] = {k: [0.0] for k in ("forward_s", "load_s", "model_hash_s", "forward_cpu_s",
                                                          "load_cpu_s", "model_hash_cpu_s")}

    def timer(cls: Any, attr: str, key: str) -> None:
        orig = getattr(cls, attr)

        def timed(self: Any, *args: Any) -> Any:
            t, c = time.perf_counter(), time.process_time()
            out = orig(self, *args)
            spent[key][0] += time.perf_counter() - t
            spent[key.replace("_s", "_cpu_s")][0] += time.process_time() - c
            return out

        setattr(cls, attr, timed)

    timer(loaded_cls, "forward", "forward_s")
    timer(engine_cls, "load", "load_s")
    kernels_for = T.fp32_kernels_for

    def recorded(model: Any) -> Any:  # which lever the fp32 path took: weights widened once and held, or per use
        k = kernels_for(model)
        spent["fp32_widened_held"] = [float(bool(k.widened))]
        return k

    T.fp32_kernels_for = recorded
    timer(engine_cls, "model_identity", "model_hash_s")  # the model's identity by content: every weight file hashed
    return spent


def _paths() -> dict[str, str]:
    """The machine kind and the bf16 / GEMM paths this process takes."""
    import torch

    from harness.engines.bf16_path import bf16_path, cpu_bf16_flags
    from harness.scoring.torch_path import gemm_path

    probe = torch.empty(0, 8, dtype=torch.bfloat16)
    return {"bf16_path": bf16_path("cpu"), "scorer_gemm": gemm_path(torch.device("cpu"), probe, probe),
            "cpu_capability": str(torch.backends.cpu.get_cpu_capability()), "cpu_bf16_flags": ",".join(cpu_bf16_flags()),
            "ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
            "MKL_ENABLE_INSTRUCTIONS": os.environ.get("MKL_ENABLE_INSTRUCTIONS", ""), "threads": str(torch.get_num_threads())}


def stage_capture(work: Path, which: str, engine: str = "transformers", device: str = "cpu") -> dict[str, Any]:
    from harness.capture.loop import capture
    from harness.engines.base import EngineOptions

    spent = _timing_patches(engine)
    t0, c0 = time.perf_counter(), time.process_time()
    out = work / (f"store-{which}" if engine == "transformers" else f"store-{which}-{engine}")
    shutil.rmtree(out, ignore_errors=True)  # this benchmark's own folder: a resumed store would skip the work
    store = capture(engine, work / which, work / "suite", out, progress=False, options=EngineOptions(device=device))
    total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
    n = len(store.indices)
    return {"seconds": total, "cpu_s": total_cpu, **{k: v[0] for k, v in spent.items()}, "contexts": n,
            "store_bytes": _dir_bytes(out), "engine": engine, "device": device, "paths": _paths(),
            "store_engine_identity": json.loads((out / "capture.json").read_text()).get("engine")}


def stage_verify(work: Path) -> dict[str, Any]:
    from harness.capture.store import CaptureStore
    from harness.inputs.suite import load_suite

    suite = load_suite(work / "suite")
    t0, c0 = time.perf_counter(), time.process_time()
    for which in ("reference", "candidate"):
        store = CaptureStore.open(work / f"store-{which}", suite, verify=True)
        for i in store.indices:  # content checks happen on load: every file re-hashed and checked
            store.load(i)
    t1, c1 = time.perf_counter(), time.process_time()
    from harness.engines.identity import model_identity

    model_identity(work / "reference")  # the model's identity by content: every weight file hashed
    return {"seconds": t1 - t0, "cpu_s": c1 - c0, "model_hash_s": time.perf_counter() - t1}


def stage_score_report(work: Path, device: str = "cpu") -> dict[str, Any]:
    import numpy as np

    from harness.capture.store import CaptureStore
    from harness.inputs.head import load_head
    from harness.inputs.suite import load_suite
    from harness.run.shard import score_shard, shard_positions
    from harness.run.shard_inputs import ShardInputs

    suite = load_suite(work / "suite")
    ref = CaptureStore.open(work / "store-reference", suite, verify=True)
    cand = CaptureStore.open(work / "store-candidate", suite, verify=True)
    t_head = time.perf_counter()
    head = load_head(work / "lm_head.safetensors")
    t0, c0 = time.perf_counter(), time.process_time()
    inputs = ShardInputs(suite=suite, shard=0, reference=ref, candidate=cand, head=head)
    pos = shard_positions(inputs, device=device)
    t1, c1 = time.perf_counter(), time.process_time()
    report = score_shard(inputs, reference_name="bf16", candidate_name="w8_rtn", positions=pos, device=device)
    paths = report.write(work / "reports")
    t2 = time.perf_counter()
    np.save(work / "kld-store.npy", pos.scores.kld)
    return {"head_load_s": t0 - t_head, "read_s": pos.load_s, "score_s": pos.score_s, "report_s": t2 - t1,
            "read_and_score_cpu_s": c1 - c0, "report_cpu_s": time.process_time() - c1,
            "positions": int(pos.scores.kld.size), "mean_kld": float(pos.scores.kld.mean()),
            "top1": float(pos.scores.top1.mean()), "scorer": pos.scorer_run,
            "report_bytes": sum(p.stat().st_size for p in paths), "paths": _paths()}


def stage_stream(work: Path, device: str = "cpu") -> dict[str, Any]:
    """Score-while-capturing (``harness.run.live_scores.capture_scored``, ``keep = "scores"``): the candidate's rows
    go from the engine to the scorer in memory; what is written is what the mode keeps (its signed scored tiles,
    the metrics). The reference store's reads are timed apart; scoring is the rest of the loop."""
    import numpy as np

    from harness.capture.store import CaptureStore
    from harness.engines.base import EngineOptions
    from harness.engines.registry import get_engine
    from harness.inputs.head import load_head
    from harness.inputs.suite import load_suite
    from harness.io.atomic import atomic_write_bytes
    from harness.metrics import summarize
    from harness.run.live_scores import capture_scored

    spent = _timing_patches("transformers")
    reads = {"read_s": [0.0], "read_cpu_s": [0.0]}
    orig_load = CaptureStore.load

    def timed_load(self: CaptureStore, index: int) -> Any:
        t, c = time.perf_counter(), time.process_time()
        got = orig_load(self, index)
        reads["read_s"][0] += time.perf_counter() - t
        reads["read_cpu_s"][0] += time.process_time() - c
        return got

    CaptureStore.load = timed_load  # type: ignore[method-assign]
    suite = load_suite(work / "suite")
    ref = CaptureStore.open(work / "store-reference", suite, verify=True)
    t_head = time.perf_counter()
    head = load_head(work / "lm_head.safetensors")
    head_load_s = time.perf_counter() - t_head
    eng = get_engine("transformers")
    eng.model_identity(work / "candidate")  # what the capture cache and the report key the candidate by
    loaded = eng.load(work / "candidate", suite.n_ctx, "hidden_states", EngineOptions(device=device))
    out = work / "stream"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    t1, c1 = time.perf_counter(), time.process_time()
    f0, fc0 = spent["forward_s"][0], spent["forward_cpu_s"][0]
    try:  # keep = "scores": the candidate's rows scored tile by tile as the engine gives them, never written
        pos = capture_scored(lambda: loaded, model=work / "candidate", engine="transformers", suite=suite, shard=0,
                             reference=ref, head=head, cand_head=None, device=device, work=out / "parts",
                             key=b"benchmark key", bound={"benchmark": "run_wide_model", "shard": 0}).positions
    finally:
        loaded.close()
    t2, c2 = time.perf_counter(), time.process_time()
    score_s = t2 - t1 - (spent["forward_s"][0] - f0) - reads["read_s"][0]
    score_cpu_s = c2 - c1 - (spent["forward_cpu_s"][0] - fc0) - reads["read_cpu_s"][0]
    metrics = summarize(pos.scores, pos.context_index, pos.row, pos.labels, n_boot=10_000)
    atomic_write_bytes(out / "metrics.json", json.dumps(metrics, default=str, sort_keys=True).encode())
    t3 = time.perf_counter()
    np.save(work / "kld-stream.npy", pos.scores.kld)
    kept = [p for p in out.rglob("*.npz") if p.is_file()]
    return {"seconds": t3 - t_head, "head_load_s": head_load_s, **{k: v[0] for k, v in spent.items()},
            **{k: v[0] for k, v in reads.items()}, "score_s": score_s, "score_cpu_s": score_cpu_s,
            "report_s": t3 - t2, "report_cpu_s": time.process_time() - c2, "contexts": len(pos.labels),
            "positions": int(pos.scores.kld.size), "mean_kld": float(pos.scores.kld.mean()), "scorer": pos.scorer_run,
            "bytes_written": _dir_bytes(out), "positions_bytes": sum(p.stat().st_size for p in kept),
            "paths": _paths()}


def _child(stage: str, work: Path, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--_stage", stage, "--work", str(work), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"stage {stage} failed:\n{out.stderr[-4000:]}")
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def per_context(fig: dict[str, Any]) -> dict[str, Any]:
    """Seconds per context per stage, for one candidate, in both modes; bytes written per candidate; peaks.

    Store-then-score: the candidate's capture (forward, store write + sha256), both stores read back and
    re-hashed, the scorer. Score-while-capturing: the forward, the reference store's read, the scorer
    (no candidate store is written or read)."""
    import numpy as np

    n, rows = fig["contexts"], fig["n_ctx"] - 1
    cap, ver, sc, st = fig["capture_candidate"], fig["verify"], fig["score"], fig["stream"]
    store = {
        "capture_forward_s": cap["forward_s"] / n,
        "store_write_hash_s": (cap["seconds"] - cap["forward_s"] - cap["load_s"] - cap["model_hash_s"]) / n,
        "store_read_s": sc["read_s"] / n,  # both stores of the shard, each file re-hashed
        "verify_both_stores_s": ver["seconds"] / n,
        "score_s": sc["score_s"] / n,
        "report_s": sc["report_s"] / n,
        "model_load_s": cap["load_s"], "model_hash_s": cap["model_hash_s"],
        "peak_rss_gib": {"capture": cap["peak_rss_gib"], "score": sc["peak_rss_gib"]},
        "bytes_written": cap["store_bytes"] + sc["report_bytes"],
    }
    stream = {
        "capture_forward_s": st["forward_s"] / n,
        "store_write_hash_s": 0.0,
        "store_read_s": st["read_s"] / n,  # the reference store only
        "score_s": st["score_s"] / n,
        "report_s": st["report_s"] / n,
        "model_load_s": st["load_s"], "model_hash_s": st["model_hash_s"],
        "peak_rss_gib": {"capture_and_score": st["peak_rss_gib"]},
        "bytes_written": st["bytes_written"],
    }
    if "cpu_s" in cap:  # the same in the process's CPU seconds (the work, on a shared machine)
        store["cpu"] = {"capture_forward_s": cap["forward_cpu_s"] / n,
                        "store_write_hash_s": (cap["cpu_s"] - cap["forward_cpu_s"] - cap["load_cpu_s"]
                                               - cap["model_hash_cpu_s"]) / n,
                        "verify_both_stores_s": ver["cpu_s"] / n,
                        "store_read_and_score_s": sc["read_and_score_cpu_s"] / n, "report_s": sc["report_cpu_s"] / n}
        stream["cpu"] = {"capture_forward_s": st["forward_cpu_s"] / n, "store_read_s": st["read_cpu_s"] / n,
                         "score_s": st["score_cpu_s"] / n, "report_s": st["report_cpu_s"] / n}
    a, b = np.load(Path(fig["work"]) / "kld-store.npy"), np.load(Path(fig["work"]) / "kld-stream.npy")
    seed_rows = N_CTX - 1  # bytes per scored row, projected to the seed suite's 5,120 contexts of 2,048 tokens
    return {
        "store_then_score": store, "score_while_capturing": stream,
        "kld_max_abs_difference": float(np.abs(a - b).max()), "kld_identical": bool(np.array_equal(a, b)),
        "bytes_per_row": {"store_then_score": store["bytes_written"] / (n * rows),
                          "score_while_capturing": st["positions_bytes"] / (n * rows)},
        "seed_suite_bytes_per_candidate": {
            "store_then_score": cap["store_bytes"] / (n * rows) * seed_rows * 5120,
            "score_while_capturing": st["positions_bytes"] / (n * rows) * seed_rows * 5120},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="folder for the models, suite, stores, reports (not committed)")
    p.add_argument("--contexts", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=N_CTX, help="tokens per context (the seed suite's: 2,048)")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--device", default="cpu", help="capture and scoring device (cpu, cuda)")
    p.add_argument("--engines", default="transformers", help="capture engines, comma-separated (transformers, vllm)")
    p.add_argument("--stages", default="build,capture,verify,score,stream",
                   help="stages to run (build once, then any of capture,verify,score,stream; --work keeps what was built)")
    p.add_argument("--reference-only", action="store_true", help="capture the reference only (no candidate, no score)")
    p.add_argument("--_stage", default=None, help=argparse.SUPPRESS)
    p.add_argument("--engine", default="transformers", help=argparse.SUPPRESS)
    p.add_argument("--which", default="reference", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._stage:
        from harness.scoring.threads import apply_default_threads

        apply_default_threads()  # as the fidelity command and the pytest plugin do
        if a._stage == "build":
            res = stage_build(a.work, a.layers, a.contexts, a.n_ctx, not a.reference_only)
        elif a._stage == "capture":
            res = stage_capture(a.work, a.which, a.engine, a.device)
        elif a._stage == "score":
            res = stage_score_report(a.work, a.device)
        elif a._stage == "stream":
            res = stage_stream(a.work, a.device)
        else:
            res = stage_verify(a.work)
        res["peak_rss_gib"] = _peak_gib()
        print(json.dumps(res, default=str))
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    stages = a.stages.split(",")
    if "build" in stages:
        built = _child("build", a.work, ["--layers", str(a.layers), "--contexts", str(a.contexts), "--n-ctx", str(a.n_ctx)]
                       + (["--reference-only"] if a.reference_only else []))
        (a.work / "build.json").write_text(json.dumps(built) + "\n")
    built = json.loads((a.work / "build.json").read_text())
    fig: dict[str, Any] = {"work": str(a.work), "layers": a.layers, "contexts": built["contexts"], "n_ctx": built["n_ctx"],
                           "hidden": HIDDEN, "vocab": VOCAB, "threads_env": os.environ.get("FIDELITY_THREADS"),
                           "load_start": os.getloadavg(), "build": built}
    print("build", built, flush=True)
    models = ("reference",) if a.reference_only else ("reference", "candidate")
    if "capture" in stages:
        for engine in a.engines.split(","):
            for which in models:
                key = f"capture_{which}" + ("" if engine == "transformers" else f"_{engine}")
                fig[key] = _child("capture", a.work, ["--which", which, "--engine", engine, "--device", a.device])
                print("capture", which, engine, fig[key], flush=True)
    for stage in ("verify", "score", "stream"):
        if stage in stages and not a.reference_only:
            fig[stage] = _child(stage, a.work, ["--device", a.device])
            print(stage, fig[stage], flush=True)
    fig["load_end"] = os.getloadavg()
    if {"capture", "verify", "score", "stream"} <= set(stages) and not a.reference_only and "transformers" in a.engines:
        fig["per_context"] = per_context(fig)
    print(json.dumps(fig, indent=2, default=str))
    if a.json:
        a.json.write_text(json.dumps(fig, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
