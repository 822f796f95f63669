"""Stand-in for `tilefold.target` and `tilefold.runtime` until they land (same names, same calls)."""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

import llvmlite.binding as llvm

llvm.initialize_native_target()
llvm.initialize_native_asmprinter()
llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()


@dataclass(frozen=True)
class Target:
    """What the GEMM generator needs to know about a machine."""

    name: str
    arch: str
    triple: str
    cpu: str
    features: frozenset[str]
    vector_bits: int
    vector_registers: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    cores: int
    family: tuple[str, ...]

    def has(self, *features: str) -> bool:
        return all(f in self.features for f in features)

    def llvm_features(self) -> str:
        return ",".join("+" + f for f in sorted(self.features))

    def is_host(self) -> bool:
        return self.name == "host"


def host_target() -> Target:
    feats = frozenset(
        k for k, v in llvm.get_host_cpu_features().items() if v
    )
    avx512 = "avx512f" in feats
    return Target(
        "host", "x86_64", llvm.get_process_triple(), llvm.get_host_cpu_name(), feats,
        512 if avx512 else 256, 32 if avx512 else 16, 48 * 1024, 2 * 1024 * 1024,
        32 * 1024 * 1024, 2, ("x86-64-v4", "x86-64-v3", "generic") if avx512 else
        ("x86-64-v3", "generic"),
    )


_V3 = frozenset({"avx", "avx2", "fma", "f16c", "bmi", "bmi2", "lzcnt", "movbe", "popcnt",
                 "sse4.1", "sse4.2", "ssse3", "sse3", "sse2", "sse", "cx16", "xsave"})


def named_target(name: str) -> Target:
    if name == "x86-64-v3":
        return Target(name, "x86_64", "x86_64-unknown-linux-gnu", "x86-64-v3", _V3, 256, 16,
                      32 * 1024, 1024 * 1024, 32 * 1024 * 1024, 2, ("x86-64-v3", "generic"))
    if name == "neoverse-v1":
        return Target(name, "aarch64", "aarch64-unknown-linux-gnu", "neoverse-v1",
                      frozenset({"neon", "fp-armv8", "sve"}), 128, 32, 64 * 1024,
                      1024 * 1024, 32 * 1024 * 1024, 2, ("neoverse-v1", "aarch64", "generic"))
    if name == "generic":
        return Target(name, "x86_64", "x86_64-unknown-linux-gnu", "x86-64", frozenset(), 128,
                      16, 32 * 1024, 1024 * 1024, 8 * 1024 * 1024, 2, ("generic",))
    raise KeyError(name)


def _machine(target: Target):
    t = llvm.Target.from_triple(target.triple)
    return t.create_target_machine(cpu=target.cpu, features=target.llvm_features(), opt=3,
                                   codemodel="jitdefault")


class CompiledModule:
    """A JIT-compiled module whose functions are callable through ctypes."""

    def __init__(self, llvm_ir: str, target: Target, name: str):
        t0 = time.perf_counter()
        mod = llvm.parse_assembly(llvm_ir)
        mod.verify()
        self._engine = llvm.create_mcjit_compiler(mod, _machine(target))
        self._engine.finalize_object()
        self.compile_seconds = time.perf_counter() - t0
        self.from_cache = False

    def address(self, sym: str) -> int:
        return self._engine.get_function_address(sym)

    def function(self, sym: str, restype, *argtypes):
        return ctypes.CFUNCTYPE(restype, *argtypes)(self.address(sym))


def compile_llvm_ir(llvm_ir: str, target: Target, *, name: str, opt_level: int = 0):
    return CompiledModule(llvm_ir, target, name)


def emit_assembly(llvm_ir: str, target: Target) -> str:
    mod = llvm.parse_assembly(llvm_ir)
    return _machine(target).emit_assembly(mod)


def num_threads() -> int:
    return 2


_WORKER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
def _sequential_parallel(fn, ctx, n):
    worker = _WORKER(fn)
    for tid in range(n):
        worker(ctx, tid, n)


llvm.add_symbol("tilefold_parallel", ctypes.cast(_sequential_parallel, ctypes.c_void_p).value)
