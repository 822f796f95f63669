"""Code generation backends below the kernel IR; importing this package registers each one."""

from tilefold.codegen.backend import llvm as llvm  # registers "llvm"
from tilefold.codegen.backend import triton as triton  # registers "triton" (imports no Triton)
from tilefold.codegen.backend.base import (
    BACKENDS,
    Backend,
    Executable,
    get_backend,
    register_backend,
)

__all__ = ["BACKENDS", "Backend", "Executable", "get_backend", "register_backend"]
