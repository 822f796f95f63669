"""Hand-written data movement: a lone `concat` or `gather` as native strided copies.

Called from Python they run NumPy's own copy into the planned output (`np.concatenate`,
`np.take`); replayed (`Kernel.calls`), they are the native copy kernel
(`codegen/cpu/copy.py`): one copy per concatenated operand into its slice of the output, one
indexed copy for a gather (an embedding lookup), so a decode step needs no Python for them.
"""

from __future__ import annotations

import numpy as np

from tilefold.codegen.cpu.copy import copy_call
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem


@register_method
class Movement(Method):
    name = "handwritten.movement"
    family = "hand-written"
    generators = ("tilefold.codegen.cpu.copy",)

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        if len(problem.body) != 1 or problem.body[0].name not in ("concat", "gather"):
            return "moves data for a lone concat or gather; this group is " + " -> ".join(
                problem.names)
        op = problem.body[0]
        if problem.types[op.results[0]].dtype.bits not in (8, 16, 32, 64):
            return f"elements of {problem.types[op.results[0]].dtype} (whole bytes only)"
        w = work(problem)
        estimate = roofline(0.0, w.bytes_fused, ctx.machine) + ctx.machine.call_s
        build = build_concat if op.name == "concat" else build_gather
        return [self.candidate({}, estimate, lambda: build(problem),
                               "native strided copies")]


def build_concat(problem: Problem) -> Kernel:
    axis = problem.attrs(problem.body[0])["axis"]

    def run(*arrays: np.ndarray) -> None:
        np.concatenate(arrays[:-1], axis=axis, out=arrays[-1])

    def calls(*arrays: np.ndarray):
        *parts, out = arrays
        at = axis % out.ndim
        found, start = [], 0
        for part in parts:
            stop = start + part.shape[at]
            if stop > start:
                index = (slice(None),) * at + (slice(start, stop),)
                call = copy_call(out[index], part)
                if call is None:
                    return None
                found.append(call)
            start = stop
        return found

    return Kernel(run, "// concat: native strided copies", strided=True, strided_out=True,
                  calls=calls)


def build_gather(problem: Problem) -> Kernel:
    axis = problem.attrs(problem.body[0])["axis"]

    def run(x: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
        np.take(x, index, axis=axis % x.ndim, out=out, mode="raise")

    def calls(x: np.ndarray, index: np.ndarray, out: np.ndarray):
        at = axis % x.ndim
        if index.dtype != np.int64 or not index.flags.c_contiguous or \
                not out.flags.c_contiguous:
            return None
        flat = index.reshape(-1)
        rows = out.reshape(*x.shape[:at], flat.size, *x.shape[at + 1:])
        call = copy_call(rows, x, index=flat, axis=at, side="src")
        return None if call is None else [call]

    return Kernel(run, "// gather: a native indexed copy", strided=True, calls=calls)
