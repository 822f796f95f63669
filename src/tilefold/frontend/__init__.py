"""PyTorch frontend: `torch.export` programs and `torch.compile(backend="tilefold")` to tilefold IR.

Importing this package is cheap: PyTorch loads only when one of its functions is used. If PyTorch
is already imported, the `tilefold` torch.compile backend is registered right away (it is also an
entry point, found by torch.compile without any import).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["backend", "explain", "from_exported_program", "register_backend"]

_LAZY = {
    "from_exported_program": "tilefold.frontend.export",
    "backend": "tilefold.frontend.dynamo",
    "explain": "tilefold.frontend.report",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_backend() -> None:
    """Register `tilefold` with torch._dynamo unless its entry point already provides it."""
    from tilefold.frontend.dynamo import register

    register()


if "torch" in sys.modules:
    register_backend()
