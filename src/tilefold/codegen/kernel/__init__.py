"""Kernel IR with schedules, for fused memory-bound groups: target-neutral; the backends of
`codegen/backend/` compile it (LLVM: `codegen/llvm/kernel.py`, Triton: `codegen/triton/`).

The names below are imported on first use: a backend's emitter reads `kernel.ir`, and
`compile_group` imports every backend, so loading this package must not load `compile`
(else importing an emitter first would import it again half-made).
"""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {
    "CompiledGroup": "compile", "compile_group": "compile", "lower_group": "compile",
    "analyze_group": "from_graph", "Kernel": "ir", "verify_kernel": "ir",
    "print_kernel": "printer", "Schedule": "schedule", "choose_schedule": "schedule",
}

__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module 'tilefold.codegen.kernel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tilefold.codegen.kernel.{_FROM[name]}"), name)
    globals()[name] = value
    return value
