#!/usr/bin/env bash
# Agreement with llama.cpp: llama-perplexity's own KL-divergence block against the harness's, on
# the same .kld file (our BF16 reference exported with `fidelity kld export`) and the same GGUF.
#
#   benchmarks/llamacpp_agreement.sh [GGUF ...]      (default: the quants in fixtures/gguf/)
#
# Environment:
#   LLSRC  llama.cpp source tree (default: the one vendored in the llama-cpp-python 0.3.36 sdist,
#          unpacked with `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36` + tar)
#   BUILD  cmake build folder for llama-perplexity (built once: -DGGML_NATIVE=OFF, that target only)
#   OUT    work folder (default /tmp/llamacpp-agreement)
#   JOBS   parallel build jobs (default 2)
#
# For each GGUF: llama-perplexity --kl-divergence reads ref.kld and prints its block; the harness
# captures the same GGUF with engine llamacpp (llama-cpp-python) and `fidelity kld stats`
# recomputes the block from ref.kld + those logits with llama.cpp's formulas. The two agree to the
# printed digits up to (a) llama-cpp-python's and llama-perplexity's builds differing in kernels
# (same source, so normally identical logits) and (b) summation order of the double sums.
# `fidelity kld stats --reference` additionally prints the exact block and our cluster bootstrap.
# llama-perplexity runs with -fa off (FA=auto to override): its default flash attention ("auto" =
# on for the CPU) changes the candidate's logits, while the engine runs without it (recorded in the
# capture's engine identity). Measured on the fixture Q8_0 with -fa off: all 43 printed values
# identical; with flash attention on, PPL(Q) 63.626245 vs 63.623304, Same top p 98.967 vs 98.852 %.
# Likewise -nr (no weight repacking; REPACK=" " to allow it): the engine loads models with
# use_extra_bufts = false, and repacked Q4_0 kernels (AVX2 Q4_0x8) give different logits.
set -euo pipefail
cd "$(dirname "$0")/.."
LLSRC=${LLSRC:-$(ls -d /tmp/llsrc/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | head -1)}
BUILD=${BUILD:-/tmp/llama-perplexity-build}
OUT=${OUT:-/tmp/llamacpp-agreement}
JOBS=${JOBS:-2}
SUITE=fixtures/suite
N_CTX=$(python -c "import json;print(json.load(open('$SUITE/suite.json'))['n_ctx'])")
if [ ! -x "$BUILD/bin/llama-perplexity" ]; then
  [ -f "$LLSRC/CMakeLists.txt" ] || { echo "set LLSRC to a llama.cpp source tree" >&2; exit 2; }
  cmake -S "$LLSRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF >/dev/null
  cmake --build "$BUILD" --target llama-perplexity -j"$JOBS"
fi
mkdir -p "$OUT"
fidelity kld export --suite $SUITE --reference fixtures/reference --head fixtures/lm_head.safetensors --out "$OUT/ref.kld"
if [ $# -eq 0 ]; then set -- fixtures/gguf/fixture-q8_0.gguf fixtures/gguf/fixture-q4_k_m.gguf fixtures/gguf/fixture-q4_0.gguf; fi
status=0
for g in "$@"; do
  n=$(basename "$g" .gguf)
  echo "== $n"
  # llama.cpp logs through an asynchronous logger that can drop the last lines at exit: retry until
  # the block is complete
  for try in 1 2 3 4 5; do
    "$BUILD/bin/llama-perplexity" -m "$g" --kl-divergence-base "$OUT/ref.kld" --kl-divergence \
        -c "$N_CTX" -b "$N_CTX" -t 2 -fa "${FA:-off}" ${REPACK:--nr} > "$OUT/$n.llama.log" 2>&1
    grep -q "^Same top p" "$OUT/$n.llama.log" && break
  done
  rm -rf "$OUT/$n.store"
  fidelity capture --engine llamacpp --model "$g" --suite $SUITE --out "$OUT/$n.store" --quiet --threads 2 >/dev/null
  fidelity kld stats --kld "$OUT/ref.kld" --suite $SUITE --candidate "$OUT/$n.store" \
      --reference fixtures/reference --head fixtures/lm_head.safetensors --json "$OUT/$n.json" > "$OUT/$n.ours.txt"
  python benchmarks/llamacpp_agreement.py "$OUT/$n.llama.log" "$OUT/$n.ours.txt" | tee "$OUT/$n.agreement.txt" || status=1
done
# Writer byte-identity: llama-perplexity writes a .kld from a text (bf16 GGUF); the harness's writer,
# fed the engine's logits for the same tokens, must reproduce the file byte for byte.
cat fixtures/corpus/howto/logging.txt fixtures/corpus/howto/regex.txt > "$OUT/text.txt"
for try in 1 2 3 4 5; do
  "$BUILD/bin/llama-perplexity" -m fixtures/gguf/fixture-bf16.gguf -f "$OUT/text.txt" -c "$N_CTX" -b "$N_CTX" -t 2 \
      -fa "${FA:-off}" ${REPACK:--nr} --kl-divergence-base "$OUT/llama_base.kld" --chunks 8 > "$OUT/base_write.log" 2>&1
  grep -q "Final estimate" "$OUT/base_write.log" && break
done
python - "$OUT" <<'PY' || status=1
import sys
from harness.engines.llamacpp import capture_logits, load_model
from harness.llamacpp.kld_file import read_kld, write_kld
out = sys.argv[1]
kf = read_kld(f"{out}/llama_base.kld")
m, _ = load_model("fixtures/gguf/fixture-bf16.gguf", kf.n_ctx, threads=2)
write_kld(f"{out}/ours_base.kld", kf.tokens, kf.n_vocab, lambda i: capture_logits(m, kf.tokens[i]).numpy())
same = open(f"{out}/llama_base.kld", "rb").read() == open(f"{out}/ours_base.kld", "rb").read()
print(f"== .kld writer: {kf.n_chunk} chunks x {kf.n_ctx}: {'byte-identical' if same else 'DIFFERENT'} to llama-perplexity's")
sys.exit(0 if same else 1)
PY
exit $status
