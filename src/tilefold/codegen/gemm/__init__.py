"""GEMM blocking: MC/KC/NC from the target's caches or the tuning record, for any
backend's register-tile GEMM (the LLVM one is `tilefold.codegen.llvm.gemm`)."""
