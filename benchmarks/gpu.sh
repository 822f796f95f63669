#!/usr/bin/env bash
# One prepared run for a GPU machine, where time is scarce (8 minutes in all): nothing is
# installed (the image holds torch, triton, numpy, llvmlite, ml_dtypes and pytest; tilefold runs
# from src/), the imports are checked first, then benchmarks/gpu.py runs each case (the device
# tests first, the TMA GEMMs last) in its own process with its own timeout, strict, and
# rewrites OUT_DIR/gpu.md and gpu.json after every case.
#   bash benchmarks/gpu.sh OUT_DIR [--smoke] [--only CASES]   (--smoke: the CPU, interpreted)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash benchmarks/gpu.sh OUT_DIR [--smoke] [--only CASES]}"
shift
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" TILEFOLD_STRICT=1
python - <<'PY' || exit 2
import importlib, sys
missing = []
for name in ("numpy", "llvmlite", "ml_dtypes", "torch", "triton", "pytest", "tilefold"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '')}")
    except Exception as exc:
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
if missing:
    sys.exit("gpu.sh: missing " + "; ".join(missing) + " -- this script installs nothing")
PY
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
# gpu.py keeps within its --budget (465 s); the outer limit only catches a stuck parent
timeout -k 5 475 python benchmarks/gpu.py "$out" "$@"
