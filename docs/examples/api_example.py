"""The Python API on this repository's fixtures (docs/api.md): a ladder of one candidate, then one shard scored
from capture stores. Run from the repository root: ``python docs/examples/api_example.py OUT``; it writes its
reports under OUT and prints the figures (tests/test_api.py runs it and checks them against the command line).
"""

import json
import sys
from pathlib import Path

from harness.api import capture, run_ladder, score

out = Path(sys.argv[1])

# 1. The configuration's ladder for one candidate and one shard (what `fidelity ladder` runs and writes).
ladder = run_ladder("fidelity.toml", candidates="int8", shards="0", out=out / "ladder")
for e in ladder.entries:
    print(f"{e.candidate}: mean KLD {e.mean_kld:.6g}, top-1 {e.top1:.4f}, {e.n_positions} positions, {e.verdict}")

# 2. A candidate model captured over shard 0, then scored against the reference store through the shared head.
store = capture("fixtures/candidates/int4_g32", "fixtures/suite", out / "int4_g32.store", shards="0")
report = score("fixtures/reference", store, "fixtures/suite", "fixtures/lm_head.safetensors", shard=0,
               name="int4_g32")
kld = report.metrics["kld"]
print(f"int4_g32 shard 0: mean KLD {kld['mean']:.6g}, 95% {kld['ci95']}")

(out / "api-example.json").write_text(json.dumps({
    "ladder": {e.candidate: e.mean_kld for e in ladder.entries},
    "score": {"int4_g32": kld["mean"], "ci95": kld["ci95"], "top1": report.metrics["top1"]["agreement"]},
}))
