"""Kernel methods and their registry: each proposes candidates for a problem, or says why not.

Adding a method is decorating its class with `@register_method` in its own file (under
`strategy/methods/`, whose package imports every file); the selector never names methods.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from tilefold.errors import TilefoldError
from tilefold.runtime.replay import NativeCall
from tilefold.strategy.cost import Machine
from tilefold.strategy.platform import CPUPlatform, Platform
from tilefold.strategy.problem import Problem

if TYPE_CHECKING:
    from tilefold.codegen.llvm.cpu.rowkernel import RowKernel

FAMILIES = ("hand-written", "auto-codegen", "building-blocks", "lto", "extern")


class Kernel:
    """A built implementation of one problem: on a CPU `run(*inputs, *outputs)` fills the
    outputs; on a GPU `run(*inputs)` returns them, tensors on the inputs' device (the target's
    `Platform.call` knows which).

    `source` is the kernel's IR (LLVM IR for native code) for `explain --kernel-ir`, or a
    function making it (a kernel loaded from the disk cache by fingerprint never built its IR);
    `asm` returns the generated assembly when there is one. `strided` kernels take inputs in
    any layout (views: transposed, sliced, broadcast), `strided_out` ones write outputs in any
    layout; others are handed C-contiguous arrays.

    `calls(*arrays)`, where given, returns the native calls (`runtime.replay.NativeCall`) that
    `run(*arrays)` makes, in order, or None when this call needs Python: a compiled graph
    whose inputs stay the same objects records them once and replays its kernels in one
    native call (`runtime/replay.py`), so `calls` must hold for as long as these very arrays
    keep their memory (it may allocate what it needs, e.g. scratch, once, for them).

    `scratch` lists (shape, dtype) of C-contiguous work arrays a CPU kernel takes after its
    outputs (`run(*inputs, *outputs, *scratch)`), whose contents do not outlive the call: the
    compiler hands every kernel of a plan buffers from one pool, so a model's GEMMs share
    their intermediate sums instead of each holding its own (`scratch_arrays()` makes a set
    for a kernel run on its own).

    `in_place` kernels read each output element's inputs at that element only, and before
    writing it: the planner may hand them an input's own array as an output of its shape (a
    donated argument the result updates: an optimizer's parameters and moments).
    """

    def __init__(self, run: Callable[..., None], source: str | Callable[[], str] = "",
                 asm: Callable[[], str] | None = None, *, strided: bool = False,
                 strided_out: bool = False,
                 calls: Callable[..., list[NativeCall] | None] | None = None,
                 scratch: tuple[tuple[tuple[int, ...], Any], ...] = (), in_place: bool = False):
        self.run = run
        self.in_place = in_place
        self._source = source
        self._asm = asm
        self.strided = strided
        self.strided_out = strided_out
        self.calls = calls
        self.scratch = scratch

    def scratch_arrays(self) -> list[np.ndarray]:
        return [np.empty(shape, dtype) for shape, dtype in self.scratch]

    @classmethod
    def native(cls, loaded: RowKernel) -> Kernel:
        """A codegen row kernel (`function`, `source`, `assembly`) as a `Kernel`."""
        native, bound = loaded.native, loaded.bound
        return cls(loaded.function, loaded.source, loaded.assembly,
                   calls=lambda *arrays: [NativeCall(native, (*arrays, *bound), bound)])

    @property
    def source(self) -> str:
        if callable(self._source):
            self._source = self._source()
        return self._source

    def asm(self) -> str:
        return self._asm() if self._asm is not None else ""


@dataclass(frozen=True)
class Candidate:
    """One way to implement a problem: its method, configuration, estimated seconds, builder."""

    method: str
    family: str
    config: dict[str, Any]
    estimate: float
    build: Callable[[], Kernel] = field(compare=False, repr=False)
    note: str = ""

    @property
    def key(self) -> str:
        """Stable text naming method and configuration, as stored in the tuning database."""
        return candidate_key(self.method, self.config)


def candidate_key(method: str, config: dict[str, Any]) -> str:
    """The tuning database's name of `method` at `config` (`Candidate.key`)."""
    return f"{method}{json.dumps(config, sort_keys=True, separators=(',', ':'))}"


@dataclass(frozen=True)
class Rejection:
    """A method that does not apply to a problem, and why."""

    method: str
    family: str
    reason: str


@dataclass(frozen=True)
class Context:
    """What methods may consult: the target, its ceilings and the thread count; its platform
    (how candidates run, are checked and timed there); where kernels are chosen per call
    (a GPU's, by the tensors' layouts), the arrays of that call; the least size the graph's
    symbolic dims take."""

    target: Any
    machine: Machine
    platform: Platform = field(default_factory=CPUPlatform)
    arrays: tuple[Any, ...] | None = None
    # the least size of every symbolic dim of the graph (`tilefold.compile(min_size=)`): what
    # may run informs choices that trade memory for time, never an answer
    min_size: int = 1

    @property
    def threads(self) -> int:
        return self.machine.threads


class Method:
    """Base of methods. Subclasses set `name` and `family` and implement `propose`;
    `generators` names the modules (packages: every file) whose code shapes the method's
    kernels besides its own module: their digest is part of the tuning key; `platforms` the
    kinds of target it proposes for (`Platform.name`: the selector asks no other)."""

    name: ClassVar[str]
    family: ClassVar[str]
    generators: ClassVar[tuple[str, ...]] = ()
    platforms: ClassVar[tuple[str, ...]] = ("cpu",)

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        """Candidates for `problem`, or the reason this method does not apply."""
        raise NotImplementedError

    def candidate(self, config: dict[str, Any], estimate: float, build: Callable[[], Kernel],
                  note: str = "") -> Candidate:
        return Candidate(self.name, self.family, config, estimate, build, note)


METHODS: dict[str, Method] = {}
M = TypeVar("M", Method, type[Method])


def register_method(method: M) -> M:
    """Add a method: an instance, or a class (as a decorator: one instance is registered and
    the class returned). A name registered twice or an unknown family is an error."""
    if isinstance(method, type):
        register_method(method())
        return method
    if method.family not in FAMILIES:
        raise TilefoldError(f"method {method.name!r}: family {method.family!r} is not one of "
                            f"{', '.join(FAMILIES)}")
    if method.name in METHODS:
        raise TilefoldError(f"a kernel method named {method.name!r} is registered already")
    METHODS[method.name] = method
    return method


def unregister_method(name: str) -> None:
    """Remove a method (tests and plug-ins that replace one)."""
    METHODS.pop(name, None)
