"""Symbolic-shape artifacts: one artifact for every size lo..hi of one symbolic dim.

The compiler plans per concrete shape (kernels are chosen per size: a GEMV for one row, a
GEMM for more; a GEMM's parameter block holds its sizes rounded to its tiles), so the
exporter records the plan at *every* size lo..hi (kernels are shared between sizes, so a
recording is cheap) and groups consecutive sizes whose step programs have the same
structure (the same calls of the same kernels, the same buffers and the same saved data
apart from integers) into a *size class*. A class holds one program: each integer that
differs across its sizes is written `{"n": [c, k]}` (c + k*n, when that holds at every size)
or `{"t": [lo, v_lo, ..., v_hi]}` (a table, one value per size); the non-data buffers are
allocated for the class's largest need; the words of saved data that differ (sizes in
parameter blocks) are `patches`, [buffer, offset, value], which the loader writes per size.
Every size is thus recorded and reproduced exactly, none inferred.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefold.aot.liveness import share_workspace
from tilefold.aot.memory import Buffer
from tilefold.aot.program import Program, record
from tilefold.compiler import CompiledGraph
from tilefold.errors import ShapeError, UnsupportedError
from tilefold.ir.types import SymDim


class _Mismatch(Exception):
    pass


def bounds_of(graph: CompiledGraph, dynamic_shapes: Any) -> list[tuple[str, list[int]]]:
    """Each symbol `dynamic_shapes` names, with its sizes: {"s": (min, max)} naming a symbol
    of the function's arguments (`?s`), every size min..max; or {"s": [n1, n2, ...]}, those
    sizes. The symbol with the most sizes (the last of equals) comes last: it is the one each
    size class fits (`aot/symbolic.py`), the others are recorded at each of their sizes."""
    if not isinstance(dynamic_shapes, dict) or not dynamic_shapes:
        raise ShapeError("dynamic_shapes must name symbolic dims and their bounds, e.g. "
                         "{'s': (1, 128)}")
    symbols = {s for a in graph.function.args for d in a.type.shape
               if isinstance(d, SymDim) for s in d.free}
    found = []
    for name, bounds in dynamic_shapes.items():
        if name not in symbols:
            raise ShapeError(f"dynamic_shapes names ?{name}, which no argument of "
                             f"{graph.function.name} has (its symbolic dims: "
                             f"{', '.join(sorted(symbols)) or 'none'})")
        found.append((name, _sizes(name, bounds)))
    inner = max(range(len(found)), key=lambda i: (len(found[i][1]), i))
    return [*found[:inner], *found[inner + 1:], found[inner]]


def _sizes(name: str, bounds: Any) -> list[int]:
    if isinstance(bounds, list):
        if not bounds or not all(type(n) is int and n >= 1 for n in bounds):
            raise ShapeError(f"dynamic_shapes[{name!r}] = {bounds!r}: a list of sizes >= 1")
        return sorted(set(bounds))
    try:
        lo, hi = (int(b) for b in bounds)
    except (TypeError, ValueError):
        raise ShapeError(f"dynamic_shapes[{name!r}] must be (min, max) or a list of sizes, "
                         f"not {bounds!r}") from None
    if not 1 <= lo <= hi:
        raise ShapeError(f"dynamic_shapes[{name!r}] = ({lo}, {hi}): need 1 <= min <= max")
    return list(range(lo, hi + 1))


def sized_inputs(graph: CompiledGraph, examples: Sequence[np.ndarray], sizes: dict[str, int]
                 ) -> list[np.ndarray]:
    """The example inputs resized so that each ?symbol of `sizes` is its size (their values
    repeated)."""
    out = []
    for arg, a in zip(graph.function.args, examples, strict=True):
        for symbol in sizes:
            if any(isinstance(d, SymDim) and symbol in d.free and d.name != symbol
                   for d in arg.type.shape):
                raise ShapeError(f"cannot export %{arg.name} of type {arg.type} with ?{symbol} "
                                 f"symbolic: an argument's dims must be ?{symbol} itself, not "
                                 "a sum of it")
        shape = tuple(sizes[d.name] if isinstance(d, SymDim) and d.name in sizes else s
                      for d, s in zip(arg.type.shape, a.shape, strict=True))
        out.append(np.resize(a, shape).astype(a.dtype, copy=False))
    return out


MAX_RECORDINGS = 4096  # sizes per export (each recorded: the plan made and run once)
SMALL = 1 << 16  # saved buffers up to this many bytes are compared word by word


class Recorder:
    """Records `graph` at sizes of `symbol`, the other symbolic dims at the sizes `fixed`
    gives (set between calls of `classes`), its programs sharing one module numbering."""

    def __init__(self, graph: CompiledGraph, examples: Sequence[np.ndarray], symbol: str):
        self.graph, self.examples, self.symbol = graph, examples, symbol
        self.fixed: dict[str, int] = {}
        self.modules: dict = {}
        self.first: Program | None = None

    def at(self, n: int) -> tuple[dict, list[Buffer], list]:
        """The step program at size n (inputs' and outputs' shapes added), its saved
        buffers, and each saved buffer's words (pointer words zeroed: the loader writes
        them) or, beyond `SMALL` bytes, a digest of them."""
        arrays = sized_inputs(self.graph, self.examples, {**self.fixed, self.symbol: n})
        program = record(self.graph, arrays, modules=self.modules)
        if self.first is None:
            self.first = program
        steps, saved = program.layout(share=False)  # shared per class, `_class`
        for ref, a in zip(steps["inputs"], arrays, strict=True):
            ref["shape"] = list(a.shape)
        for ref, a in zip(steps["outputs"], program.results, strict=True):
            ref["shape"] = list(a.shape)
        numbers = [i for i, b in enumerate(steps["buffers"]) if b["kind"] == "data"]
        words = []
        for i, buffer in zip(numbers, saved, strict=True):
            content = bytearray(buffer.content())
            for where, _ in steps["pointers"]:
                if where[0] == i:
                    content[where[1]:where[1] + 8] = bytes(8)
            words.append(hashlib.sha256(content).hexdigest() if len(content) > SMALL
                         or len(content) % 8 else np.frombuffer(bytes(content), np.int64))
        return steps, saved, words

    def classes(self, sizes: Sequence[int]) -> list[dict[str, Any]]:
        """Each class (consecutive sizes of `sizes`, ascending): its sizes, its program (with
        `patches`) and its saved buffers."""
        done: list[dict[str, Any]] = []
        run: list[tuple[int, dict, list[Buffer], list]] = []
        for n in sizes:
            steps, saved, words = self.at(n)
            if run and (n != run[-1][0] + 1 or _skeleton(steps, words)
                        != _skeleton(run[0][1], run[0][3])):
                done.append(_class(run))
                run = []
            run.append((n, steps, saved if not run else [], words))  # the first's kept
        done.append(_class(run))
        return done


def _skeleton(steps: dict, words: list) -> Any:
    """What must be equal across a class: the program with its integers blanked (but the
    saved buffers' sizes), and the saved buffers' lengths (or digests, for large ones)."""
    def blank(x: Any) -> Any:
        if isinstance(x, dict):
            return tuple((k, blank(v)) for k, v in x.items())
        if isinstance(x, list):
            return tuple(blank(v) for v in x)
        return None if type(x) is int else x
    data = [b["bytes"] for b in steps["buffers"] if b["kind"] == "data"]
    return blank(steps), data, [w if isinstance(w, str) else len(w) for w in words]


def _class(run: list[tuple[int, dict, list[Buffer], list]]) -> dict[str, Any]:
    ns = [n for n, *_ in run]
    top = [max(steps["buffers"][i]["bytes"] for _, steps, _, _ in run)
           for i in range(len(run[0][1]["buffers"]))]
    programs = []
    for _, steps, _, _ in run:  # non-data buffers at the class's largest need
        programs.append({**steps, "buffers": [
            b if b["kind"] == "data" else {**b, "bytes": t}
            for b, t in zip(steps["buffers"], top, strict=True)]})
    try:
        template = fit_all(programs, ns)
    except _Mismatch:  # the skeletons were equal: a string or float differs
        raise UnsupportedError(f"cannot export: the programs at sizes {ns[0]}..{ns[-1]} "
                               "differ in more than integers") from None
    numbers = [i for i, b in enumerate(run[0][1]["buffers"]) if b["kind"] == "data"]
    patches = []
    for j, i in enumerate(numbers):
        if isinstance(run[0][3][j], str):
            continue
        stack = np.stack([words[j] for *_, words in run])
        for w in np.flatnonzero((stack != stack[0]).any(axis=0)).tolist():
            patches.append([i, 8 * w, fit_all([int(v) for v in stack[:, w]], ns)])
    template["patches"] = patches
    for n, program, (*_, words) in zip(ns, programs, run, strict=True):  # checked, each size
        got = evaluate(template, n)
        for buffer, offset, value in got.pop("patches"):
            assert words[numbers.index(buffer)][offset // 8] == value
        assert got == program, f"size class program differs at size {n}"
    # The class's workspace buffers, each at its largest size, share by lifetime (the calls
    # and their buffers are the same at every size of a class).
    return {"lo": ns[0], "hi": ns[-1], "program": share_workspace(template),
            "saved": run[0][2]}


def fit_all(values: list, ns: list[int]) -> Any:
    """One structure for `values` (recorded at consecutive sizes `ns`): an int that differs
    is {"n": [c, k]} where c + k*n holds at every size, else {"t": [ns[0], *values]}."""
    x = values[0]
    if any(type(v) is not type(x) for v in values):
        raise _Mismatch
    if isinstance(x, dict):
        if any(v.keys() != x.keys() for v in values):
            raise _Mismatch
        return {k: fit_all([v[k] for v in values], ns) for k in x}
    if isinstance(x, list):
        if any(len(v) != len(x) for v in values):
            raise _Mismatch
        return [fit_all([v[i] for v in values], ns) for i in range(len(x))]
    if type(x) is int:
        if all(v == x for v in values):
            return x
        k = values[1] - x  # ns are consecutive
        if all(v == x + k * (n - ns[0]) for v, n in zip(values, ns, strict=True)):
            return {"n": [x - k * ns[0], k]}
        return {"t": [ns[0], *values]}
    if any(v != x for v in values):
        raise _Mismatch
    return x


def evaluate(t: Any, n: int) -> Any:
    """A class's program at size n (the loader has its own copy: `artifact/load.py`)."""
    if isinstance(t, dict):
        if t.keys() == {"n"}:
            c, k = t["n"]
            return c + k * n
        if t.keys() == {"t"}:
            return t["t"][1 + n - t["t"][0]]
        return {key: evaluate(v, n) for key, v in t.items()}
    if isinstance(t, list):
        return [evaluate(v, n) for v in t]
    return t
