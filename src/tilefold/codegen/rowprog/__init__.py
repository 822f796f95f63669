"""Row programs: GEMM epilogues over the rows of C, built from the op-lowering table."""

from tilefold.codegen.llvm.rowprog import Emitter
from tilefold.codegen.rowprog.program import NotARowProgram, Program, build_program

__all__ = ["Emitter", "NotARowProgram", "Program", "build_program"]
