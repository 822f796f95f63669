"""The BLIS-shaped fp32 GEMM: micro-kernel registry, blocking, packing, driver, GEMV and plans."""

from tilefold.codegen.gemm.blocking import Blocking, derive_blocking
from tilefold.codegen.gemm.describe import describe
from tilefold.codegen.gemm.module import GemmModule, gemm_ir, gemm_module
from tilefold.codegen.gemm.plan import make_plan
from tilefold.codegen.gemm.prepack import PackedMatrix
from tilefold.codegen.gemm.registry import MICROKERNELS, MicroKernel, select_microkernel

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
