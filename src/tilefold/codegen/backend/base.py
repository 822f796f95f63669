"""The backend interface below the kernel IR, and the table of backends looked up by name.

A backend turns a `codegen.kernel` `Kernel` and its `Schedule` into native code for one kind of
target, and says beforehand whether it can (`supports` returns the reason it cannot). Methods
and the kernel driver (`codegen/kernel/compile.py`) name a backend, never a code generator:

    backend = get_backend("llvm")
    if (reason := backend.supports(kernel, target)) is None:
        entry = backend.compile(kernel, schedule, target).entry
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from tilefold.errors import TilefoldError, lookup
from tilefold.passes.fusion_policy import CPU_FUSION, FusionPolicy, register_fusion_policy

if TYPE_CHECKING:  # the kernel driver imports this table: no import back at run time
    from tilefold.codegen.kernel.ir import Kernel
    from tilefold.codegen.kernel.schedule import Schedule


@dataclass(frozen=True)
class Executable:
    """A compiled kernel: `entry` is its native entry point, as the backend's calling
    convention describes it; `source` makes the code it was compiled from (LLVM IR text)."""

    entry: Any
    source: Callable[[], str]
    multi: Any = None  # the entry over a table of tensors, where the backend has one


class Backend(ABC):
    """One code generator below the kernel IR. `name` is its registry key; `fingerprint`
    changes with its code and enters every cache key of what it compiles; `fusion` is what its
    kernels can hold, which the fusion pass asks (`fusion{backend=NAME}`): the CPU's rules
    unless the backend gives its own."""

    name: ClassVar[str]
    fusion: ClassVar[FusionPolicy] = CPU_FUSION

    @abstractmethod
    def supports(self, kernel: Kernel, target: Any) -> str | None:
        """None when this backend can compile `kernel` for `target`, else the reason not."""

    @abstractmethod
    def fingerprint(self) -> str:
        """A digest of the backend's generators: equal digests generate equal code."""

    @abstractmethod
    def compile(self, kernel: Kernel, schedule: Schedule, target: Any) -> Executable:
        """Native code for `kernel` run by `schedule` on `target` (cached by the backend)."""

    @abstractmethod
    def assembly(self, kernel: Kernel, schedule: Schedule, target: Any) -> str:
        """The machine code `compile` makes, as text (`tilefold explain --asm`)."""


BACKENDS: dict[str, Backend] = {}


def register_backend(cls: type[Backend]) -> type[Backend]:
    """Class decorator adding one instance of `cls` to the table, and its fusion policy to the
    fusion pass's; a name taken twice is an error."""
    if cls.name in BACKENDS:
        raise TilefoldError(f"a code generation backend named {cls.name!r} is registered already")
    BACKENDS[cls.name] = cls()
    register_fusion_policy(cls.name, cls.fusion)
    return cls


def get_backend(name: str) -> Backend:
    """The backend registered as `name`."""
    return lookup(BACKENDS, name, "code generation backend")
