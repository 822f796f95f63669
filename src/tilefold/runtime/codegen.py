"""LLVM IR text to object code or assembly for any `Target` (the only place LLVM codegen runs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import llvmlite.binding as llvm

from tilefold.errors import CompileError
from tilefold.target import Target, target_machine
from tilefold.target.machine import LLVM_LOCK, parse_for_target

T = TypeVar("T")

_HIDDEN_LINKAGES = {llvm.Linkage.internal, llvm.Linkage.private}
_codegen_runs = 0


@dataclass(frozen=True)
class ObjectCode:
    """An object file and the symbols it defines for callers (functions and globals)."""

    data: bytes
    exports: tuple[str, ...]


def codegen_runs() -> int:
    """How many times this process ran LLVM codegen; a warm kernel cache keeps it at zero."""
    return _codegen_runs


def _parse(llvm_ir: str, target: Target, machine: llvm.TargetMachine, name: str) -> llvm.ModuleRef:
    try:
        module = parse_for_target(llvm_ir, target, machine)
    except RuntimeError as exc:
        raise CompileError(
            f"LLVM rejected module {name!r} for {target.name}: {str(exc).strip()}; "
            "fix the IR generator (dump it with TILEFOLD_LOG=kernels)"
        ) from exc
    module.name = name
    return module


def _optimize(module: llvm.ModuleRef, machine: llvm.TargetMachine, opt_level: int) -> None:
    if opt_level <= 0:
        return
    tuning = llvm.create_pipeline_tuning_options(speed_level=min(opt_level, 3))
    builder = llvm.create_pass_builder(machine, tuning)
    builder.getModulePassManager().run(module, builder)


def _exports(module: llvm.ModuleRef) -> tuple[str, ...]:
    names = [
        value.name
        for values in (module.functions, module.global_variables)
        for value in values
        if not value.is_declaration and value.linkage not in _HIDDEN_LINKAGES
    ]
    return tuple(sorted(names))


def _codegen(llvm_ir: str, target: Target, name: str, opt_level: int, jit: bool,
             emit: Callable[[llvm.TargetMachine, llvm.ModuleRef], T],
             strength_reduce: bool = True, pic: bool = False) -> T:
    """Parse, optionally optimize, and `emit(machine, module)` under the LLVM lock."""
    global _codegen_runs
    with LLVM_LOCK:
        machine = target_machine(target, jit=jit, pic=pic)
        module = _parse(llvm_ir, target, machine, name)
        _optimize(module, machine, opt_level)
        _codegen_runs += 1
        if strength_reduce:
            return emit(machine, module)
        llvm.set_option("", "-disable-lsr")  # a process-wide flag, so only while we hold the lock
        try:
            return emit(machine, module)
        finally:
            llvm.set_option("", "-disable-lsr=false")


def compile_object(
    llvm_ir: str, target: Target, *, name: str = "module", opt_level: int = 0, jit: bool = True,
    strength_reduce: bool = True, pic: bool = False,
) -> ObjectCode:
    """Backend codegen at -O3; `opt_level` > 0 also runs the middle-end pipeline first.

    `jit` selects the large code model, which a JIT needs to place code anywhere.
    `strength_reduce=False` skips the backend's loop strength reduction, a fifth to a third of
    codegen time for loop-heavy modules, for IR whose loops already step their own pointers.
    `pic` (with `jit=False`) makes position-independent code for a shared library.
    """
    return _codegen(llvm_ir, target, name, opt_level, jit,
                    lambda machine, module: ObjectCode(machine.emit_object(module),
                                                       _exports(module)),
                    strength_reduce, pic)


def emit_object(llvm_ir: str, target: Target, *, opt_level: int = 0) -> bytes:
    """A relocatable object file for `target` (any architecture LLVM knows)."""
    return compile_object(llvm_ir, target, opt_level=opt_level, jit=False).data


def emit_assembly(llvm_ir: str, target: Target, *, opt_level: int = 0,
                  strength_reduce: bool = True) -> str:
    """The assembly LLVM generates for `target`, e.g. to check a NEON kernel uses `fmla`."""
    return _codegen(llvm_ir, target, "module", opt_level, False,
                    lambda machine, module: machine.emit_assembly(module), strength_reduce)
