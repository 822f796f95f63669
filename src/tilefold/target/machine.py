"""Turns a `Target` into an llvmlite `TargetMachine` (every LLVM backend, for cross assembly)."""

from __future__ import annotations

import functools
import os
import threading

import llvmlite.binding as llvm

from tilefold.errors import UnsupportedError
from tilefold.target.target import Target

# llvmlite parses into one global LLVM context, which is not thread-safe: hold this around
# every parse, optimization, codegen and JIT link in the process. A fork waits for it, so a
# child never inherits LLVM (or this lock) in the middle of a compile.
LLVM_LOCK = threading.RLock()
os.register_at_fork(
    before=LLVM_LOCK.acquire, after_in_parent=LLVM_LOCK.release, after_in_child=LLVM_LOCK.release
)


@functools.cache
def _init_backends() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_asmparser()


def target_machine(target: Target, *, jit: bool = False, pic: bool = False
                   ) -> llvm.TargetMachine:
    """A fresh machine for `target` at codegen -O3 (a JIT engine takes ownership of its own).

    JIT code uses the large code model so relocations reach anywhere in the address space;
    `pic` makes position-independent code, for a shared library (an exported artifact).
    """
    _init_backends()
    try:
        llvm_target = llvm.Target.from_triple(target.triple)
    except RuntimeError as exc:
        raise UnsupportedError(
            f"this llvmlite has no backend for {target.triple} ({target.name}): {exc}"
        ) from exc
    return llvm_target.create_target_machine(
        cpu=target.cpu,
        features=target.llvm_features(),
        opt=3,
        reloc="pic" if pic else "default",
        codemodel="jitdefault" if jit else "default",
        jit=jit,
    )


def parse_for_target(llvm_ir: str, target: Target,
                     machine: llvm.TargetMachine) -> llvm.ModuleRef:
    """Parse and verify `llvm_ir` with `target`'s triple and `machine`'s data layout (call
    under `LLVM_LOCK`); LLVM's complaint about invalid IR comes out as a RuntimeError."""
    module = llvm.parse_assembly(llvm_ir)
    module.triple = target.triple
    module.data_layout = str(machine.target_data)
    module.verify()
    return module
