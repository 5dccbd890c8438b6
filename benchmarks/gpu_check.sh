#!/usr/bin/env bash
# GPU check, < 5 minutes on one H100/H200 (each step has its own time limit; a failing or skipped
# step is reported and the next one still runs). Writes its figures under ${OUT:-gpu_check_out}/.
#   1. the fused Triton scorer vs two bare cuBLAS GEMMs at 27B widths (benchmarks/gpu_check.py,
#      32,768 positions: agreement, block sweep, ratios, projection);
#   2. the tiled torch scorer (cuda-out-dtype GEMMs) vs two bare cuBLAS bf16 GEMMs for one
#      2,048-token context at hidden 5,120 x vocab 248,320 (benchmarks/bench_wide_scorer.py);
#   3. a randomly initialised Qwen3 at the same widths (1 layer), built on the spot, one context
#      captured on CUDA through transformers and through vLLM (benchmarks/run_wide_model.py).
# Usage: bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: no nvidia-smi: this machine has no NVIDIA GPU"; exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch; assert torch.cuda.is_available(), 'torch without CUDA'; print('torch', torch.__version__)" \
    || { echo "gpu_check: torch with CUDA is required"; exit 2; }
python -c "import triton" 2>/dev/null || python -m pip install -q --no-deps 'triton==3.8.0' || true
step() {  # name, limit in seconds, command...
    local name=$1 limit=$2; shift 2
    echo "== $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0))s"
}
step fused 110 python benchmarks/gpu_check.py --positions 32768 --subset-positions 4096 --sweep-positions 4096
step wide_scorer 40 python benchmarks/bench_wide_scorer.py --device cuda --reps 3 --check-rows 8 --json "$OUT/wide_scorer.json"
W="${TMPDIR:-/tmp}/fidelity_gpu_wide"
ENGINES=transformers
python -c "import vllm" 2>/dev/null && ENGINES=transformers,vllm || echo "gpu_check: vllm not installed: the vLLM capture is skipped"
step wide_model 130 python benchmarks/run_wide_model.py --work "$W" --contexts 1 --reference-only --device cuda \
    --engines "$ENGINES" --json "$OUT/wide_model.json"
rm -rf "$W"
