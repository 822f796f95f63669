"""Row programs: GEMM epilogues over the rows of C, built from the op-lowering table; the
backends emit them (LLVM: `codegen/llvm/rowprog.py`, Triton: `codegen/triton/gemm.py`)."""

from tilefold.codegen.rowprog.program import NotARowProgram, Program, build_program

__all__ = ["NotARowProgram", "Program", "build_program"]
