"""A compiled graph's plan for one set of static shapes, recorded as a relocatable step program:
the native calls it makes (each function as a symbol of a compiled module), every pointer
argument as (buffer, offset), every array object as a header the loader writes.

The plan runs once on arrays of the exporter's own (as `compiler.Recording` does), then each
step gives its native calls; a step without them (one that runs Python) cannot be exported and
is refused, naming it.
"""

from __future__ import annotations

import copy
import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilefold.aot.liveness import share_workspace
from tilefold.aot.memory import Buffer, Memory, extent
from tilefold.artifact.format import ALIGN
from tilefold.codegen.llvm.cpu.copy import OUT_OF_RANGE
from tilefold.compiler import CompiledGraph
from tilefold.errors import UnsupportedError
from tilefold.runtime.build import module_at
from tilefold.runtime.compiled_module import CompiledModule
from tilefold.runtime.replay import NativeCall, call_signature, exclusive_replay, table_value
from tilefold.strategy.select import native_steps


@dataclass
class Program:
    """The recorded step program before it is written: what `program.json` holds, and the
    modules whose symbols its calls name."""

    memory: Memory
    calls: list[dict[str, Any]] = field(default_factory=list)
    signatures: list[str] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    modules: dict[str, CompiledModule] = field(default_factory=dict)  # by key, in first use
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    results: list[np.ndarray] = field(default_factory=list)  # the recording run's outputs
    constants: dict[int, np.ndarray] = field(default_factory=dict)  # the graph's, by id

    def symbol(self, module: CompiledModule, name: str) -> str:
        """`name` of `module` as the library exports it (modules may share names)."""
        self.modules.setdefault(module.key, module)
        return library_symbol(list(self.modules).index(module.key), name)

    def layout(self, share: bool = True) -> tuple[dict[str, Any], list[Buffer]]:
        """What program.json holds, and the buffers whose bytes data.bin holds, in its order.
        Only buffers the program refers to are kept (a weight the GEMM reads only as its
        packed copy is not saved twice), numbered afresh; `share`: workspace buffers whose
        lifetimes do not overlap share one arena (`aot/liveness.py`)."""
        pointers = [[list(w), list(t)] for w, t in self.memory.pointer_words()]
        calls, objects, inputs, outputs = copy.deepcopy(
            (self.calls, self.objects, self.inputs, self.outputs))
        refs = [a[1] for c in calls for a in c["args"] if a[0] == "addr"]
        refs += [o["at"] for o in (*objects, *inputs, *outputs)]
        # Numbered in order of first reference (not by address), pointer words in the order
        # of where they lie, so that programs recorded at two sizes number alike
        # (`aot/symbolic.py` fits one to the other).
        first = dict.fromkeys(r[0] for r in refs)
        pointers.sort(key=lambda p: (list(first).index(p[0][0]) if p[0][0] in first
                                     else len(first), p[0]))
        refs += [r for pair in pointers for r in pair]
        kept = list(dict.fromkeys(r[0] for r in refs))
        number = {old: new for new, old in enumerate(kept)}
        for ref in refs:  # each a [buffer, offset] list of the copies, renumbered in place
            ref[0] = number[ref[0]]
        buffers, saved, offset = [], [], 0
        for old in kept:
            b = self.memory.buffers[old]
            spec: dict[str, Any] = {"kind": b.kind, "bytes": b.nbytes}
            if b.kind == "data":
                spec["offset"] = offset
                offset += -(-b.nbytes // ALIGN) * ALIGN
                saved.append(b)
            buffers.append(spec)
        steps = {"buffers": buffers, "pointers": pointers, "objects": objects, "calls": calls,
                 "inputs": inputs, "outputs": outputs,
                 "status": [i for i, b in enumerate(buffers) if b["kind"] == "status"]}
        return (share_workspace(steps) if share else steps), saved


def library_symbol(number: int, name: str) -> str:
    return f"m{number}.{name}"


def record(graph: CompiledGraph, inputs: Sequence[np.ndarray],
           modules: dict[str, CompiledModule] | None = None) -> Program:
    """The step program of `graph` at the shapes of `inputs` (run once on copies of them);
    `modules`: a numbering of modules shared with other recordings (`aot/symbolic.py`)."""
    arrays = [np.array(a, order="C") for a in inputs]
    # A plan of its own: extern methods only where nothing else applies, and every
    # intermediate in a buffer of its own (`layout` shares them by exact lifetimes).
    with native_steps():
        plan = graph.plan_for(*[a.shape for a in arrays], reuse=False)
    env = list(plan.env)
    outputs = [np.empty(shape, dtype) for _, shape, dtype in plan.output_slots]
    plan.execute(env, arrays, outputs)
    calls: list[NativeCall] = []
    for native, label in zip(plan.natives, plan.labels, strict=True):
        with exclusive_replay():  # the loader runs one step at a time
            got = native(env) if native is not None else None
        if got is None:
            raise UnsupportedError(
                f"cannot export: step {label!r} runs in Python (no native form at these "
                "shapes); `tilefold explain` shows its method: choose shapes or a graph whose "
                "every step is native")
        calls += got
    results = [env[s] for s, _ in plan.results]
    memory = _memory(graph, env, arrays, outputs, calls)
    program = Program(memory, results=[np.array(r) for r in results],
                      constants={id(a): a for a in _constants(graph)})
    if modules is not None:
        program.modules = modules
    objects: dict[int, int] = {}
    for call in calls:
        _add_call(program, call, objects)
    program.inputs = [{"at": list(_at(memory, a)), "strides": list(a.strides)} for a in arrays]
    program.outputs = [{"at": list(_at(memory, r)), "strides": list(r.strides)}
                       for r in results]
    return program


def _memory(graph: CompiledGraph, env: list, arrays: list, outputs: list,
            calls: list[NativeCall]) -> Memory:
    memory = Memory()
    for i, a in enumerate(arrays):
        memory.add(a, "input", i)
    for i, a in enumerate(outputs):
        memory.add(a, "output", i)
    memory.add(OUT_OF_RANGE, "status")
    constant = {extent(v) for v in _constants(graph)}  # a view of one has its extent
    per_call = {extent(a) for a in (*arrays, *outputs)}  # and their views
    for a in env:
        if isinstance(a, np.ndarray) and extent(a) not in per_call:
            memory.add(a, "constant" if extent(a) in constant else "workspace")
    for call in calls:  # parameter blocks and a kernel's own arrays; its workspaces
        for a in (*call.keep, *call.args):
            if isinstance(a, np.ndarray):
                memory.add(a, "data", scan=extent(a) not in constant)
        for a in call.scratch:
            memory.add(a, "workspace")
    for v in _constants(graph):
        memory.add(v, "constant")
    memory.seal()
    return memory


def _constants(graph: CompiledGraph) -> list[np.ndarray]:
    """The arrays the optimized graph's ops hold (weights, fused groups' constants)."""
    return [v for op in graph.module.walk() for v in op.attrs.values()
            if isinstance(v, np.ndarray)]


def _at(memory: Memory, array: np.ndarray) -> tuple[int, int]:
    found = memory.find(array.ctypes.data)
    if found is None:
        raise UnsupportedError("cannot export: an array of the program lies in no buffer")
    return found


def _add_call(program: Program, call: NativeCall, objects: dict[int, int]) -> None:
    address = ctypes.cast(call.function, ctypes.c_void_p).value or 0
    owner = module_at(address)
    if owner is None:
        raise UnsupportedError(f"cannot export: a step calls native code at {address:#x} that "
                               "no compiled tilefold module holds (a Python callback?)")
    module, name = owner
    signature = call_signature(call.function)
    if module.recipe is None:
        raise UnsupportedError(f"cannot export kernel {module.name!r}: its IR cannot be made "
                               "again")
    args = []
    for kind, argtype, value in zip(signature, call.function.argtypes, call.args, strict=True):
        if argtype is ctypes.py_object:
            if not isinstance(value, np.ndarray):
                raise UnsupportedError(f"cannot export kernel {module.name!r}: it takes a "
                                       f"Python {type(value).__name__}, not an array")
            args.append(["object", _object(program, value, objects)])
        elif kind == "p" and (raw := table_value(kind, argtype, value)) != 0:
            args.append(_pointer(program, module, raw, objects, call))
        else:
            args.append(["value", table_value(kind, argtype, value)])
    program.calls.append({"symbol": program.symbol(module, name), "signature": signature,
                          "args": args})
    program.signatures.append(signature)


def _pointer(program: Program, module: CompiledModule, raw: int, objects: dict[int, int],
             call: NativeCall) -> list:
    """A raw pointer argument: the id of an array object the kernel reads, or an address."""
    known = {id(a): a for a in (*call.keep, *call.args, *call.scratch)
             if isinstance(a, np.ndarray)}
    known.update(program.constants)
    if raw in known:
        return ["object", _object(program, known[raw], objects)]
    found = program.memory.find(raw)
    if found is None:
        raise UnsupportedError(f"cannot export kernel {module.name!r}: an argument points to "
                               f"memory ({raw:#x}) in no buffer of the program")
    return ["addr", list(found)]


def _object(program: Program, array: np.ndarray, objects: dict[int, int]) -> int:
    """The number of the header standing for `array` (one per distinct array object)."""
    number = objects.get(id(array))
    if number is None:
        number = objects[id(array)] = len(program.objects)
        program.objects.append({"at": list(_at(program.memory, array)),
                                "shape": list(array.shape), "strides": list(array.strides)})
    return number
