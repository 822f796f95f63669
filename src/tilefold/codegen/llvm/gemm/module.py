"""Builds, compiles (through the runtime's disk cache) and loads the GEMM and GEMV modules.

Both are cached under a fingerprint of their generators' source and parameters, not of their IR:
building the IR in Python costs more than loading the cached object, so a warm process skips it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

from llvmlite import ir

from tilefold.codegen.llvm.gemm.abi import Entries, entry_points
from tilefold.codegen.llvm.gemm.driver import ENTRY, PACK_B, emit_gemm
from tilefold.codegen.llvm.gemm.gemv import GEMV_ENTRY, emit_gemv
from tilefold.codegen.llvm.gemm.packing import SOURCES
from tilefold.codegen.llvm.gemm.registry import MicroKernel, select_microkernel
from tilefold.errors import UnsupportedError
from tilefold.runtime import CompiledModule, compile_generated, source_digest
from tilefold.target import Target, host_target

log = logging.getLogger("tilefold.kernels")
_P = ctypes.c_void_p
# How GEMM modules are compiled (tests check their assembly compiled the same way): the hot
# loops (micro-kernels, packing) step their own pointers, so LLVM's loop strength reduction, a
# fifth to a third of the backend's time on these modules, is left out.
CODEGEN_OPTIONS = {"strength_reduce": False}
# The code that shapes the emitted IR (part of each module's cache key).
_GENERATORS = ("tilefold.codegen.gemm", "tilefold.codegen.llvm.gemm", "tilefold.codegen.llvm")


def _fingerprint(what: str, **params) -> str:
    return (f"{what} {source_digest(*_GENERATORS)} "
            + " ".join(f"{k}={v!r}" for k, v in params.items()))


def _kernel_params(kernel: MicroKernel) -> dict:
    """The kernel's fields as fingerprint text: sets sorted, since a set's repr follows string
    hashing, which differs from process to process (a warm process then missed the cache)."""
    gen = kernel.generator
    return {**{k: tuple(sorted(v)) if isinstance(v, frozenset) else v
               for k, v in vars(kernel).items() if k != "generator"},
            "generator": f"{gen.__module__}.{gen.__qualname__}"}


def packs_row_major_a(target: Target, kernel: MicroKernel, src: str = "f32") -> bool:
    """Whether plans give `kernel` A with contiguous rows to pack: for f32 only on targets
    without a "rows" kernel for every width, which otherwise reads such A in place
    (`plan._for_shape`)."""
    rows = select_microkernel(target, kernel.dtype, "rows")
    return not kernel.a_direct and (
        src != "f32" or rows.shape_class != "rows" or rows.max_n is not None)


def check_source(target: Target, kernel: MicroKernel, src: str) -> None:
    """Refuse a source element type this module cannot widen while packing."""
    if src not in SOURCES:
        raise UnsupportedError(f"GEMM: no packing from {src!r} elements; known: "
                               + ", ".join(SOURCES))
    if src != "f32" and kernel.a_direct:
        raise UnsupportedError(f"GEMM: micro-kernel {kernel.name} reads A in place, so it "
                               f"cannot take {src} operands; use a packing ('general') kernel")
    # Without F16C, LLVM lowers `fpext half` to a call of `__extendhfsf2` (compiler-rt or
    # libgcc), which the JIT is not promised to find.
    if src == "f16" and target.arch == "x86_64" and not target.has("f16c"):
        raise UnsupportedError(f"GEMM: f16 operands need F16C on {target.name}; convert them "
                               "to float32 first")


def gemm_ir(target: Target, kernel: MicroKernel, src: str = "f32") -> str:
    """The LLVM IR text of the GEMM module for `kernel` on `target`, A and B of `src`."""
    check_source(target, kernel, src)
    suffix = "" if src == "f32" else f"_{src}"
    module = ir.Module(name=f"tf_gemm_{kernel.name}{suffix}")
    module.triple = target.triple
    emit_gemm(module, kernel, row_major_a=packs_row_major_a(target, kernel, src),
              src=SOURCES[src])
    return str(module)


def gemv_ir(target: Target, lanes: int, src: str = "f32") -> str:
    """The LLVM IR text of the matrix-vector module for vectors of `lanes` floats over `src`
    operands."""
    module = ir.Module(name=f"tf_gemv_{src}_{lanes}")
    module.triple = target.triple
    emit_gemv(module, lanes, src)
    return str(module)


def _compile(target, name: str, fingerprint: str, make_ir, **options) -> CompiledModule:
    compiled = compile_generated(fingerprint, make_ir, target, name=name, uses_pool=True,
                                 **options)
    log.info("%s for %s: %.1f ms%s", name, target.name, compiled.compile_seconds * 1e3,
             " (from cache)" if compiled.from_cache else "")
    return compiled


class GemmModule:
    """The GEMM module for `kernel` and its ctypes entry point `fn(params, A, B, C, ws)`; its
    GEMV entry points come from a second module (f32 only). `src` is A's and B's element type
    ("f32", "bf16", "f16"; C is f32): other than f32 they are widened while packed.

    Each module compiles on first use, not on construction: a plan often routes a product to
    another shape class's module (row-major A to "rows"), and the first call should not pay
    for compiling one it never runs.
    """

    def __init__(self, target: Target, kernel: MicroKernel, src: str = "f32"):
        check_source(target, kernel, src)
        self.target = target
        self.kernel = kernel
        self.src = src

    @functools.cached_property
    def compiled(self) -> CompiledModule:
        src = self.src
        extra = {} if src == "f32" else {"src": src}  # f32 keys stay as they were
        name = f"gemm_{self.kernel.name}" + ("" if src == "f32" else f"_{src}")
        return _compile(self.target, name,
                        _fingerprint("gemm", **_kernel_params(self.kernel), **extra,
                                     row_major_a=packs_row_major_a(self.target, self.kernel,
                                                                   src)),
                        lambda: gemm_ir(self.target, self.kernel, src), **CODEGEN_OPTIONS)

    @functools.cached_property
    def entries(self) -> Entries:
        """`tf_gemm` taking array objects, and taking raw pointers (`abi.NativePlan`)."""
        return entry_points(self.compiled, ENTRY)

    @functools.cached_property
    def pack_b(self) -> Callable[..., None]:
        i64 = ctypes.c_int64
        return self.compiled.function(PACK_B, None, i64, i64, _P, i64, i64, _P)

    @functools.cached_property
    def gemv_compiled(self) -> CompiledModule:
        lanes, src = self.kernel.lanes, self.src
        return _compile(self.target, f"gemv_{src}_{lanes}",
                        _fingerprint("gemv", lanes=lanes, src=src),
                        lambda: gemv_ir(self.target, lanes, src))

    @property
    def gemv_entries(self) -> Entries:
        return entry_points(self.gemv_compiled, GEMV_ENTRY)


@functools.cache
def gemm_module(target: Target | None = None, kernel: MicroKernel | None = None,
                src: str = "f32") -> GemmModule:
    """The (process-wide, cached) GEMM module for `target` (default: the host) with A and B of
    `src` elements."""
    target = target or host_target()
    return GemmModule(target, kernel or select_microkernel(target), src)
