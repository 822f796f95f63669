"""The LLVM backend for CPUs: everything that builds LLVM IR (llvmlite), JITs it and
calls it, apart from the target-neutral kernel IR, row programs, lowering table and GEMM
blocking it reads."""
