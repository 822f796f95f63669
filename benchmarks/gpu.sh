#!/usr/bin/env bash
# One prepared run for a GPU machine, where time is scarce (the benchmark capped at 8 minutes):
# install tilefold with Triton, check correctness and time tilefold's GPU kernels (GEMMs bf16 and
# fp8 with row-wise scales, softmax/layer_norm/rms_norm, a SwiGLU MLP through torch.compile,
# attention) against cuBLAS, torch._scaled_mm, PyTorch eager, torch.compile and SDPA; the table
# and JSON go to the folder given, rewritten after every case (a run cut short keeps them).
#   bash benchmarks/gpu.sh OUT_DIR [--smoke] [--no-max-autotune]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash benchmarks/gpu.sh OUT_DIR [options]}"
shift
python -c "import torch, triton" 2>/dev/null || pip install -q torch "triton==3.6.0"
pip install -q -e . --no-deps
python -c "import ml_dtypes, llvmlite" 2>/dev/null || pip install -q ml_dtypes llvmlite
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
timeout 480 python benchmarks/gpu.py "$out" "$@"
