"""Kernel IR with schedules and its LLVM lowering, for fused memory-bound groups."""

from tilefold.codegen.kernel.compile import CompiledGroup, compile_group, lower_group
from tilefold.codegen.kernel.from_graph import analyze_group
from tilefold.codegen.kernel.ir import Kernel, verify_kernel
from tilefold.codegen.kernel.printer import print_kernel
from tilefold.codegen.kernel.schedule import Schedule, choose_schedule
from tilefold.codegen.llvm.kernel import emit_kernel

__all__ = [
    "CompiledGroup",
    "Kernel",
    "Schedule",
    "analyze_group",
    "choose_schedule",
    "compile_group",
    "emit_kernel",
    "lower_group",
    "print_kernel",
    "verify_kernel",
]
