"""Runs a lowered graph on PyTorch tensors: argument selection, checks, and the executor choice."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tilefold.errors import FallbackError, TilefoldError, strict
from tilefold.frontend.converter import Converted, SizeOutput
from tilefold.frontend.tensors import to_numpy, to_torch
from tilefold.ir import Module, interpret
from tilefold.ir.dims import Bindings
from tilefold.ir.interpreter import bind_symbols
from tilefold.ir.types import SymDim
from tilefold.runtime.thread_pool import thread_pool

log = logging.getLogger("tilefold.frontend")


class Executor:
    """Runs a module on NumPy arrays with `tilefold.compile`; the reference interpreter takes
    over (with a log line) if compilation or a kernel method fails for this module, except in
    strict mode (`strict`, else `TILEFOLD_STRICT`), where that failure is a `FallbackError`.

    `label` names the module in messages (the graph, and the partition when there are several);
    `donate` (result -> argument) lets results be written into their arguments' arrays;
    `min_size` is the least size of its symbolic dims (`tilefold.compile`'s); `passes=False`:
    the module is optimized already (`tilefold.compile`'s).
    """

    def __init__(self, module: Module, label: str = "graph", strict: bool | None = None,
                 donate: dict[int, int] | None = None, weights: str | None = None,
                 min_size: int = 1, passes: bool = True):
        self.module, self.label, self.strict = module, label, strict
        self.compiled: Any = None
        self.name = "interpreter"
        self.last_shapes: list[tuple] | None = None
        try:
            from tilefold.compiler import compile as tilefold_compile

            self.compiled = tilefold_compile(module, strict=strict, donate=donate,
                                             weights=weights, min_size=min_size, passes=passes)
            self.name = "tilefold.compile"
        except (ImportError, TilefoldError) as exc:
            self._fall_back("tilefold.compile failed", exc)

    def _fall_back(self, what: str, exc: Exception) -> None:
        message = f"{self.label}: {what}: {type(exc).__name__}: {exc}"
        if strict(self.strict):
            raise FallbackError(f"{message} (strict mode: the reference interpreter does not take "
                                "over; unset TILEFOLD_STRICT to allow it)") from exc
        log.warning("tilefold: %s; running on the reference interpreter", message)
        self.compiled, self.name = None, "interpreter"

    def decisions(self) -> list[Any]:
        """The kernel choices (`strategy.Decision`) made for the shapes of the last call."""
        if self.compiled is None or self.last_shapes is None:
            return []
        return self.compiled.decisions(*self.last_shapes)

    def groups(self) -> list[tuple[str, str]]:
        """(the group's ops joined by "+", the kernel method that ran it) per fused group at the
        last call; on the interpreter, every op with the method "interpreter"."""
        if self.compiled is None:
            return [(op.name, "interpreter") for op in self.module.walk()
                    if op.name not in ("constant", "return")]
        return [("+".join(d.problem.names), d.winner.method if d.winner else "none")
                for d in self.decisions()]

    def methods(self) -> dict[str, int]:
        """How many groups (ops, on the interpreter) each kernel method ran at the last call."""
        counts: dict[str, int] = {}
        for _, method in self.groups():
            counts[method] = counts.get(method, 0) + 1
        return counts

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        self.last_shapes = [a.shape for a in arrays]
        if self.compiled is not None:
            try:
                return self.compiled(*arrays)
            except Exception as exc:  # a compiler gap must not fail the model: log, interpret
                self._fall_back("the compiled graph failed", exc)
        return interpret(self.module, *arrays)


class GraphRunner:
    """Calls a lowered graph with the graph's own (flat) arguments and returns torch tensors.

    Inputs are checked against the IR signature before anything runs, so a wrong shape or
    dtype is a `ShapeError`/`DTypeError` naming the input, not a failure deep in a kernel.
    State the graph writes (`Converted.mutations`) lands in the caller's tensors: in place
    when the compiled graph wrote it there, else copied back after the call.
    """

    def __init__(self, converted: Converted, label: str = "graph", strict: bool | None = None,
                 weights: str | None = None):
        self.converted = converted
        self.function = converted.module.functions[next(iter(converted.module.functions))]
        # Without symbolic dims in its inputs there are no sizes to bind (the executor checks
        # the inputs); size arguments and the dims derived from them still evaluate
        self._symbolic = any(isinstance(d, SymDim) for a in self.function.args
                             for d in a.type.shape)
        # Dynamo specializes sizes 0 and 1: a symbolic dim of its graphs is at least 2
        self.run = Executor(converted.module, label, strict, converted.donated(), weights, 2,
                            passes=not converted.optimized)
        written = set(converted.mutations.values())
        # (result, argument, its array's index): an optimizer's hundreds, found once
        position = {p: i for i, p in enumerate(converted.arg_indices)}
        self._mutations = [(r, p, position[p]) for r, p in converted.mutations.items()]
        self._inputs = [_StableInput(p not in written) for p in converted.arg_indices]
        # Park tilefold's spinning workers after a call (PyTorch runs next and gets the
        # cores); a caller running tilefold graphs back to back turns it off.
        self.park = True
        self.holds_inputs = True  # `transient()` turns it off
        self._passed: dict[int, int] = {}  # result -> the argument it is (`transient()`)

    def transient(self, shared: Any = None) -> None:
        """Keep nothing of a call's inputs past it: no input array is held for the next call
        and the compiled graph neither records nor replays (a replay writes its results into
        buffers of its own, held between calls, and copies them out). For a graph whose inputs
        are new tensors every call, or whose results are large and kept by the caller: the
        training graphs, whose forward returns the activations the backward reads, and whose
        backward would otherwise keep the last step's activations alive until the next.
        `shared` (a `compiler.SharedBuffers`): the intermediate buffers come from that pool,
        which the caller's other graphs share (none of them runs while another does)."""
        self.holds_inputs = False
        for stable in self._inputs:
            stable.key = stable.array = None
        compiled = self.run.compiled
        if compiled is not None:
            compiled.replay = False
            compiled.lend_inputs = True  # an input returned (a saved weight): the tensor itself
            fn = self.function
            self._passed = {i: self.converted.arg_indices[fn.args.index(v)]
                            for i, v in enumerate(fn.outputs) if v in fn.args}
            if shared is not None:
                compiled.share(shared)

    @property
    def executor(self) -> str:
        return self.run.name

    @property
    def optimized(self) -> Module | None:
        """The module the pass pipeline made of the lowered one (what `graph_cache` stores of
        a graph without frozen weights); None where the interpreter runs it."""
        return None if self.run.compiled is None else self.run.compiled.module

    def __call__(self, *args: Any) -> list[Any]:
        given = self.converted.arguments(args)  # size inputs come as arrays
        arrays = ([stable.array_of(a) for stable, a in zip(self._inputs, given, strict=True)]
                  if self.holds_inputs else [_array(a) for a in given])
        sizes = self._sizes(arrays)
        outputs = self.run(*arrays)
        if self.park:
            thread_pool().park()  # PyTorch runs next: its threads get the CPUs, not our spinners
        return self._results(args, arrays, outputs, sizes)

    def consume(self, args: list) -> list[Any]:
        """`self(*args)`, emptying `args` (AOTAutograd's boxed backward call): the compiled
        graph lets each input go after its last use (`CompiledGraph.consume`), so a saved
        activation no one else holds is freed as the backward goes, and the gradients reuse
        its memory. A graph that reads its arguments after the call (state it writes back,
        arguments it returns, size arguments, results viewing them) runs as a plain call."""
        compiled = self.run.compiled
        if compiled is None or self.holds_inputs or self._mutations or self._passed or \
                self.converted.size_args or self.converted.views is not None:
            from tilefold.compiler import handed_over

            return handed_over(self, args)
        arrays = [_array(a) for a in self.converted.arguments(args)]
        args.clear()
        sizes = self._sizes(arrays)
        outputs = compiled.consume(arrays)
        if self.park:
            thread_pool().park()
        return self._results((), [], outputs, sizes)

    def _sizes(self, arrays: list) -> Bindings:
        """The symbolic dims' sizes the inputs bind (none to bind without symbolic inputs)."""
        return bind_symbols(self.function, arrays) if self._symbolic else Bindings()

    def _results(self, args: Sequence[Any], arrays: list, outputs: list, sizes: dict
                 ) -> list[Any]:
        """The call's results as PyTorch sees them, state written back into `args`."""
        for r, p, a in self._mutations:  # state the graph wrote, unless in place
            if outputs[r] is not arrays[a]:
                args[p].copy_(to_torch(outputs[r]))
            elif isinstance(args[p], torch.Tensor):  # written in place: as PyTorch's add_
                torch.autograd.graph.increment_version(args[p])
        results = [to_torch(r) for r in outputs]
        for i, p in self._passed.items():  # as autograd saw it (its version counter too)
            if isinstance(args[p], torch.Tensor) and args[p].shape == results[i].shape and \
                    args[p].dtype == results[i].dtype:
                results[i] = args[p]
        for i, lead in self.converted.flattened.items():  # as PyTorch sees them
            results[i] = results[i].flatten(0, lead - 1)
        for p, symbol in self.converted.size_args.items():
            sizes[symbol] = int(args[p])
        final = [None if i is None else i.value(sizes) if isinstance(i, SizeOutput) else results[i]
                 for i in self.converted.outputs]
        views = self.converted.views
        return final if views is None else views(args, final)


def _array(t: Any) -> np.ndarray:
    return t if isinstance(t, np.ndarray) else to_numpy(t)


class _StableInput:
    """One graph input's NumPy array, the same object from call to call while it can be, so
    the compiled graph replays its recorded kernels (`compiler.Recording`): a tensor with the
    same memory, shape and strides as the last call's gets the last array back; a small one
    the graph only reads (a decode step's token ids and positions, new tensors every step) is
    copied into the last array when its memory changed; a size input (`Converted.arguments`:
    an array standing for a number) gets the last array back while its value stays. A
    tensor's array is held only while the caller's tensor lives (a weak reference to it):
    one the caller drops (an optimizer's gradients, `zero_grad` sets them to None) is let go
    at once, so the last call's does not stay alive beside the next one's. Such an input, or
    a larger tensor whose memory changed from one call to the next, is new every call
    (`fleeting`): its arrays are held no more."""

    SMALL_BYTES = 1 << 12

    def __init__(self, copy_small: bool):
        self.copy_small = copy_small
        self.key: tuple | None = None
        self.array: np.ndarray | None = None
        self._owner: weakref.ref | None = None  # the tensor whose memory `array` is
        self.fleeting = False  # its memory changed: new every call, never held again

    def _dropped(self, owner: weakref.ref) -> None:
        if owner is self._owner:  # the caller let go of the tensor: so do we, for good
            self._let_go()

    def _let_go(self) -> None:
        """New every call from now on: hold no array again."""
        self.key = self.array = self._owner = None
        self.fleeting = True

    def _hold(self, t: torch.Tensor) -> None:
        if self._owner is None or self._owner() is not t:
            self._owner = weakref.ref(t, self._dropped)

    def array_of(self, t: Any) -> np.ndarray:
        if isinstance(t, np.ndarray):  # a size input's IR form: the last array for its value
            key = (t.shape, t.dtype, t.tobytes())
            if key != self.key or self.array is None:
                self.key, self.array = key, t
            return self.array
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or self.fleeting:
            return to_numpy(t)
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
        last = self.array
        if key == self.key and last is not None:
            self._hold(t)
            return last
        new = to_numpy(t)
        if self.key is not None and new.nbytes > self.SMALL_BYTES:
            self._let_go()
            return new
        if (self.copy_small and last is not None and last.shape == new.shape
                and last.dtype == new.dtype and new.nbytes <= self.SMALL_BYTES
                and last.flags.writeable and new.flags.c_contiguous):
            last[...] = new
            return last
        if self.copy_small and new.nbytes <= self.SMALL_BYTES:
            new = np.array(new)  # our own copy, so later calls can write into it
            self.key = self._owner = None
        else:
            self.key = key
            self._hold(t)
        self.array = new
        return new
