"""Runs compiled code: the JIT and its on-disk kernel cache, and the native parallel runtime."""

from tilefold.runtime.codegen import codegen_runs, emit_assembly, emit_object
from tilefold.runtime.compile import compile_generated, compile_llvm_ir
from tilefold.runtime.compiled_module import CompiledModule
from tilefold.runtime.kernel_cache import source_digest
from tilefold.runtime.thread_pool import RegionCost, ThreadPool, num_threads, thread_pool
from tilefold.target import cache_dir

__all__ = [
    "CompiledModule",
    "RegionCost",
    "ThreadPool",
    "cache_dir",
    "codegen_runs",
    "compile_generated",
    "compile_llvm_ir",
    "emit_assembly",
    "emit_object",
    "num_threads",
    "source_digest",
    "thread_pool",
]
