"""Auto-codegen: the kernel IR + schedule code generator for memory-bound groups.

It plugs in `tilefold.codegen.kernel`'s entry for graph-IR groups; until that entry exists
this method reports so, and `explain` shows the reason.
"""

from __future__ import annotations

import importlib

from tilefold.strategy.method import Method

ENTRY = ("tilefold.codegen.kernel", "compile_group")


class KernelCodegen(Method):
    name = "autocodegen.kernel"
    family = "auto-codegen"

    def propose(self, problem, ctx):
        module, attr = ENTRY
        try:
            entry = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            return f"{module} has no graph-group entry ({attr}) yet"
        if problem.kind == "compute":
            return "compute groups belong to the GEMM building blocks"
        return entry(problem, ctx)
