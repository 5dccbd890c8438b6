"""A whole run at 27B widths on a CPU: build, capture, store, score, report, and the cost of each stage.

Built at benchmark time in ``--work`` (never committed): a randomly initialised ``Qwen3ForCausalLM``
with the seed suite's widths -- hidden 5,120, vocabulary 248,320, ``--layers`` decoder layers
(default 1; intermediate 17,408, 40 query / 8 key-value heads of 128), untied LM head, bf16 -- as
the reference; a candidate with the same weights except the decoder layers' linear weights rounded
to int8 (per-output-row absmax, round to nearest: a W8 RTN quantization); a word-level tokenizer
with 248,320 ids; a corpus of random words cut into ``--contexts`` contexts of 2,048 tokens
(one shard); the shared head exported from the reference.

Then, each stage in its own child process (its peak resident memory is that process's ``ru_maxrss``):

* ``capture``  -- both models through engine ``transformers`` into capture stores (the shared
  capture loop: the model's identity by content -- its weight files hashed --, load, forward,
  bf16 rows, safetensors write, sha256); identity, load and forward are timed inside the
  engine, the rest of the loop is "store write + hash";
* ``verify``   -- both stores opened and every context loaded (each file re-hashed and checked),
  and the reference model's identity by content (its weight files hashed) timed on its own;
* ``score``    -- the shard's positions through the shared head (``shard_positions``: the exact scorer);
* ``report``   -- statistics (10,000-replicate bootstrap) and the shard report written (JSON + Markdown).

    python benchmarks/run_wide_model.py --work /tmp/wide --contexts 2 --json wide.json

Disk: ~5.8 GB per model folder, 21 MB per stored context; memory: ~7.5 GB at capture
(the model, 1 GB of bf16 logits its forward computes), ~4 GB at scoring.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, VOCAB, N_CTX = 5120, 248_320, 2048
INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 17_408, 40, 8, 128


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- stages (children)


def stage_build(work: Path, layers: int, contexts: int, candidate: bool = True) -> dict[str, Any]:
    import numpy as np
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Qwen3Config, Qwen3ForCausalLM

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
        ids = rng.integers(0, VOCAB, N_CTX + 7)
        (corpus / f"doc{d:03d}.txt").write_text(" ".join(f"w{i}" for i in ids), "utf-8")
    suite = build_suite(work / "corpus", work / "tokenizer.json", n_ctx=N_CTX, n_contexts=contexts, n_shards=1, seed=0,
                        out=work / "suite")
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=layers,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                      max_position_embeddings=N_CTX, tie_word_embeddings=False)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # initialise in bf16: never an fp32 copy of 2.9 G parameters
    model = Qwen3ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    t_init = time.perf_counter()
    model.save_pretrained(work / "reference", safe_serialization=True, max_shard_size="2GB")
    with torch.no_grad():
        if not candidate:
            del model
            export_head(work / "reference", work / "lm_head.safetensors")
            return {"seconds": time.perf_counter() - t0, "init_s": t_init - t0, "contexts": suite.n_contexts,
                    "model_bytes": _dir_bytes(work / "reference")}  # W8 RTN of every decoder linear weight
        for name, p in model.named_parameters():
            if name.startswith("model.layers.") and p.ndim == 2:
                scale = p.float().abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
                p.copy_((p.float() / scale).round().clamp(-127, 127).mul(scale).to(p.dtype))
    model.save_pretrained(work / "candidate", safe_serialization=True, max_shard_size="2GB")
    del model
    export_head(work / "reference", work / "lm_head.safetensors")
    return {"seconds": time.perf_counter() - t0, "init_s": t_init - t0, "contexts": suite.n_contexts,
            "model_bytes": _dir_bytes(work / "reference")}


def stage_capture(work: Path, which: str, engine: str = "transformers", device: str = "cpu") -> dict[str, Any]:
    from harness.capture.loop import capture
    from harness.engines import transformers as T
    from harness.engines import vllm as V
    from harness.engines.base import EngineOptions

    forward_s = [0.0]
    load_s = [0.0]
    loaded_cls, engine_cls = (T.TransformersLoaded, T.TransformersEngine) if engine == "transformers" else (V.VllmLoaded, V.VllmEngine)
    orig = loaded_cls.forward
    orig_load = engine_cls.load

    def timed(self: Any, token_ids: Any, kind: str) -> Any:
        t = time.perf_counter()
        out = orig(self, token_ids, kind)
        forward_s[0] += time.perf_counter() - t
        return out

    def timed_load(self: Any, *args: Any) -> Any:
        t = time.perf_counter()
        out = orig_load(self, *args)
        load_s[0] += time.perf_counter() - t
        return out

    ident_s = [0.0]
    orig_ident = engine_cls.model_identity

    def timed_ident(self: Any, *args: Any) -> Any:  # the model's identity by content: every weight file hashed
        t = time.perf_counter()
        out = orig_ident(self, *args)
        ident_s[0] += time.perf_counter() - t
        return out

    engine_cls.model_identity = timed_ident  # type: ignore[method-assign]

    loaded_cls.forward = timed  # type: ignore[method-assign]
    engine_cls.load = timed_load  # type: ignore[method-assign]
    t0 = time.perf_counter()
    out = work / (f"store-{which}" if engine == "transformers" else f"store-{which}-{engine}")
    store = capture(engine, work / which, work / "suite", out, progress=False, options=EngineOptions(device=device))
    total = time.perf_counter() - t0
    n = len(store.indices)
    return {"seconds": total, "load_s": load_s[0], "forward_s": forward_s[0], "model_hash_s": ident_s[0], "contexts": n,
            "store_bytes": _dir_bytes(out), "engine": engine, "device": device}


def stage_verify(work: Path) -> dict[str, Any]:
    from harness.capture.store import CaptureStore
    from harness.inputs.suite import load_suite

    suite = load_suite(work / "suite")
    t0 = time.perf_counter()
    for which in ("reference", "candidate"):
        store = CaptureStore.open(work / f"store-{which}", suite, verify=True)
        for i in store.indices:  # content checks happen on load: every file re-hashed and checked
            store.load(i)
    t1 = time.perf_counter()
    from harness.engines.identity import model_identity

    model_identity(work / "reference")  # the model's identity by content: every weight file hashed
    return {"seconds": t1 - t0, "model_hash_s": time.perf_counter() - t1}


def stage_score_report(work: Path, device: str = "cpu") -> dict[str, Any]:
    from harness.capture.store import CaptureStore
    from harness.inputs.head import load_head
    from harness.inputs.suite import load_suite
    from harness.run.shard import score_shard, shard_positions
    from harness.run.shard_inputs import ShardInputs

    suite = load_suite(work / "suite")
    ref = CaptureStore.open(work / "store-reference", suite, verify=False)
    cand = CaptureStore.open(work / "store-candidate", suite, verify=False)
    t_head = time.perf_counter()
    head = load_head(work / "lm_head.safetensors")
    t0 = time.perf_counter()
    inputs = ShardInputs(suite=suite, shard=0, reference=ref, candidate=cand, head=head)
    pos = shard_positions(inputs, device=device)
    t1 = time.perf_counter()
    report = score_shard(inputs, reference_name="bf16", candidate_name="w8_rtn", positions=pos, device=device)
    paths = report.write(work / "reports")
    t2 = time.perf_counter()
    return {"head_load_s": t0 - t_head, "score_s": t1 - t0, "report_s": t2 - t1, "positions": int(pos.scores.kld.size),
            "mean_kld": float(pos.scores.kld.mean()), "top1": float(pos.scores.top1.mean()), "scorer": pos.scorer_run,
            "report_bytes": sum(p.stat().st_size for p in paths)}


STAGES = {"build": stage_build, "capture": stage_capture, "verify": stage_verify, "score": stage_score_report}


def _child(stage: str, work: Path, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--_stage", stage, "--work", str(work), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"stage {stage} failed:\n{out.stderr[-4000:]}")
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="folder for the models, suite, stores, reports (not committed)")
    p.add_argument("--contexts", type=int, default=2)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--device", default="cpu", help="capture and scoring device (cpu, cuda)")
    p.add_argument("--engines", default="transformers", help="capture engines, comma-separated (transformers, vllm)")
    p.add_argument("--stages", default="build,capture,verify,score",
                   help="stages to run (build once, then any of capture,verify,score; --work keeps what was built)")
    p.add_argument("--reference-only", action="store_true", help="capture the reference only (no candidate, no score)")
    p.add_argument("--_stage", default=None, help=argparse.SUPPRESS)
    p.add_argument("--engine", default="transformers", help=argparse.SUPPRESS)
    p.add_argument("--which", default="reference", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._stage:
        from harness.scoring.threads import apply_default_threads

        apply_default_threads()  # as the fidelity command and the pytest plugin do
        fn = STAGES[a._stage]
        if a._stage == "build":
            res = fn(a.work, a.layers, a.contexts, not a.reference_only)
        elif a._stage == "capture":
            res = fn(a.work, a.which, a.engine, a.device)
        elif a._stage == "score":
            res = fn(a.work, a.device)
        else:
            res = fn(a.work)
        res["peak_rss_gib"] = _peak_gib()
        print(json.dumps(res, default=str))
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    fig: dict[str, Any] = {"layers": a.layers, "contexts": a.contexts, "n_ctx": N_CTX, "hidden": HIDDEN, "vocab": VOCAB,
                           "threads_env": os.environ.get("FIDELITY_THREADS"), "load_start": os.getloadavg()}
    stages = a.stages.split(",")
    models = ("reference",) if a.reference_only else ("reference", "candidate")
    if "build" in stages:
        fig["build"] = _child("build", a.work, ["--layers", str(a.layers), "--contexts", str(a.contexts)]
                              + (["--reference-only"] if a.reference_only else []))
        print("build", fig["build"], flush=True)
    if "capture" in stages:
        for engine in a.engines.split(","):
            for which in models:
                key = f"capture_{which}" + ("" if engine == "transformers" else f"_{engine}")
                fig[key] = _child("capture", a.work, ["--which", which, "--engine", engine, "--device", a.device])
                print("capture", which, engine, fig[key], flush=True)
    if "verify" in stages and not a.reference_only:
        fig["verify"] = _child("verify", a.work, [])
    if "score" in stages and not a.reference_only:
        fig["score"] = _child("score", a.work, ["--device", a.device])
    fig["load_end"] = os.getloadavg()
    if a.reference_only or not {"capture", "verify", "score"} <= set(stages) or "transformers" not in a.engines.split(","):
        print(json.dumps(fig, indent=2, default=str))
        if a.json:
            a.json.write_text(json.dumps(fig, indent=2, default=str) + "\n")
        return 0
    n = a.contexts
    per = {
        "capture_forward_s": sum(fig[f"capture_{w}"]["forward_s"] for w in ("reference", "candidate")) / (2 * n),
        "store_write_hash_s": sum(fig[f"capture_{w}"]["seconds"] - fig[f"capture_{w}"]["forward_s"]
                                  - fig[f"capture_{w}"]["load_s"] - fig[f"capture_{w}"].get("model_hash_s", 0.0)
                                  for w in ("reference", "candidate")) / (2 * n),
        "model_hash_s_per_model": sum(fig[f"capture_{w}"].get("model_hash_s", 0.0) for w in ("reference", "candidate")) / 2,
        "model_load_s_per_model": sum(fig[f"capture_{w}"]["load_s"] for w in ("reference", "candidate")) / 2,
        "verify_s": fig["verify"]["seconds"] / (2 * n),
        "score_s": fig["score"]["score_s"] / n,
        "report_s": fig["score"]["report_s"] / n,
    }
    fig["per_context_per_model"] = per
    print(json.dumps(fig, indent=2, default=str))
    if a.json:
        a.json.write_text(json.dumps(fig, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
