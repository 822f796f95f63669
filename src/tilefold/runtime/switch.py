"""`Switch`: a flag that is on only within `with switch.on():`, in that thread or task.

Some choices hold for one dynamic extent rather than for the process: plans made for an
exported artifact (`strategy.select.NATIVE_STEPS`), a step recorded to run one call sequence at
a time (`runtime.replay.EXCLUSIVE`), a plan made for a target this host cannot run
(`runtime.compiled_module.PLANNING_ONLY`). A `ContextVar` keeps each to its thread or task.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator


class Switch:
    """Off, except within `on()`."""

    def __init__(self, name: str):
        self._var: contextvars.ContextVar[bool] = contextvars.ContextVar(name, default=False)

    def get(self) -> bool:
        return self._var.get()

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        token = self._var.set(True)
        try:
            yield
        finally:
            self._var.reset(token)
