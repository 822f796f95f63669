"""The BLIS-shaped fp32 GEMM in LLVM: micro-kernel registry, packing, driver, GEMV and plans
(blocking, target-neutral, is `tilefold.codegen.gemm`'s)."""

from tilefold.codegen.gemm.blocking import Blocking, derive_blocking
from tilefold.codegen.llvm.gemm.describe import describe
from tilefold.codegen.llvm.gemm.module import GemmModule, gemm_ir, gemm_module
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.gemm.registry import MICROKERNELS, MicroKernel, select_microkernel

__all__ = [
    "MICROKERNELS",
    "Blocking",
    "GemmModule",
    "MicroKernel",
    "PackedMatrix",
    "derive_blocking",
    "describe",
    "gemm_ir",
    "gemm_module",
    "make_plan",
    "select_microkernel",
]
