#!/usr/bin/env bash
# GPU check of the fused Triton scorer (see benchmarks/gpu_check.py); < 5 minutes on an H100/H200.
# Usage: bash benchmarks/gpu_check.sh [gpu_check.py options]
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: no nvidia-smi: this machine has no NVIDIA GPU"; exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import triton" 2>/dev/null || python -m pip install -q --no-deps 'triton==3.8.0' || true
exec timeout 290 python benchmarks/gpu_check.py "$@"
