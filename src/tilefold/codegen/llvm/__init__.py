"""The LLVM backend for CPUs: everything that builds LLVM IR (llvmlite), JITs it and calls it.

`codegen/backend/llvm.py` registers it. Flat modules: `util.py` (IR helpers), `memory.py`
(loads and stores by dtype), `kernel.py` (the kernel IR's emitter), `rowprog.py` (GEMM
epilogues); packages: `vecmath/`, `gemm/`, `lowp/`, `attention/`, `cpu/`. It reads the
target-neutral kernel IR, lowering table, row programs and GEMM blocking, which never import
it (`tests/test_layering.py`).
"""
