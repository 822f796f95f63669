"""Hand-written data movement: a lone `concat`, `gather`, `index` by constant indices or
`index_put` by one index tensor as native strided copies.

Called from Python they run NumPy's own copy into the planned output (`np.concatenate`,
`np.take`); replayed (`Kernel.calls`), they are the native copy kernel
(`codegen/llvm/cpu/copy.py`): one copy per concatenated operand into its slice of the output, one
indexed copy for a gather (an embedding lookup), so a decode step needs no Python for them.
An `index` over adjacent axes (the attention masks transformers builds,
`mask[arange(b)[:, None, None, None], arange(s)]`) is a gather along those axes merged into
one: by positions computed once when it is built when its index tensors are all constants of
the graph, else (a symbolic length's `arange(s)`) by positions a scalar loop
(`codegen/llvm/cpu/scalar.py`) computes from them before each copy, an index out of its axis'
range made one out of the copy's (which the copy reports).
An `index_put` whose operand 0 cannot be overwritten (a graph result, or a zero-filled
broadcast: an embedding's gradient) copies it into the output, then scatters its values there
natively, added with `accumulate` (`codegen/llvm/cpu/copy.scatter_call`: in the index's order, the
sums of `np.add.at`), so a table's gradient is one fill and one pass over the token rows.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from tilefold import dtypes
from tilefold.codegen.llvm.cpu.copy import ADDS, copy_call, scatter_call
from tilefold.codegen.llvm.cpu.scalar import Node, ScalarGroup, scalar_kernel
from tilefold.ir.ops.index import index_key, put
from tilefold.ir.shapes import broadcast_shapes
from tilefold.runtime.replay import NativeCall
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.methods.scalar import element_strides
from tilefold.strategy.problem import Problem


@register_method
class Movement(Method):
    name = "handwritten.movement"
    family = "hand-written"
    generators = ("tilefold.codegen.llvm.cpu.copy",)

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        if len(problem.body) != 1 or problem.body[0].name not in BUILDERS:
            return "moves data for a lone concat, gather or index; this group is " + \
                " -> ".join(problem.names)
        op = problem.body[0]
        why = (index_refusal(problem) if op.name == "index" else
               index_put_refusal(problem) if op.name == "index_put" else None)
        if why is not None:
            return why
        dtype = problem.types[op.results[0]].dtype
        if dtype.bits not in (8, 16, 32, 64) and dtype != dtypes.boolean:  # bool: a byte each
            return f"elements of {dtype} (whole bytes only)"
        if op.name == "index_put" and problem.attrs(op).get("accumulate") and \
                np.dtype(dtype.np_dtype).name not in ADDS:
            return f"an accumulating index_put of {dtype} (adds {', '.join(ADDS)} only)"
        w = work(problem)
        estimate = roofline(0.0, w.bytes_fused, ctx.machine) + ctx.machine.call_s
        build = BUILDERS[op.name]
        return [self.candidate({}, estimate, lambda: build(problem, ctx),
                               "native strided copies")]


def build_concat(problem: Problem, ctx: Context) -> Kernel:
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


def build_gather(problem: Problem, ctx: Context) -> Kernel:
    axis = problem.attrs(problem.body[0])["axis"]

    def run(x: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
        np.take(x, index, axis=axis % x.ndim, out=out, mode="raise")

    def calls(x: np.ndarray, index: np.ndarray, out: np.ndarray):
        at = axis % x.ndim
        if index.dtype != np.int64 or not out.flags.c_contiguous:
            return None
        found = []
        if not index.flags.c_contiguous:  # a broadcast index: copied dense first, per call
            dense = np.empty(index.shape, np.int64)
            fill = copy_call(dense, index)
            if fill is None:
                return None
            found.append(replace(fill, scratch=(dense,)))
            index = dense
        flat = index.reshape(-1)
        rows = out.reshape(*x.shape[:at], flat.size, *x.shape[at + 1:])
        call = copy_call(rows, x, index=flat, axis=at, side="src")
        return None if call is None else [*found, call]

    return Kernel(run, "// gather: a native indexed copy", strided=True, calls=calls)


def index_refusal(problem: Problem) -> str | None:
    """Why a lone `index` has no native copy here (None: it has)."""
    op = problem.body[0]
    rank = len(problem.shape(op.operands[0]))
    axes = [a % rank for a in problem.attrs(op)["axes"]]
    if axes != list(range(axes[0], axes[0] + len(axes))):
        return "index over axes that are not adjacent"
    if any(v not in problem.constants for v in op.operands[1:]):
        if any(problem.types[v].dtype != dtypes.i64 for v in op.operands[1:]):
            return "index by tensors computed at run time that are not all i64"
        return None
    try:
        merged_positions(problem)
    except IndexError as exc:
        return f"index out of range ({exc}): left to NumPy, which raises it"
    return None


def merged_positions(problem: Problem) -> np.ndarray:
    """The constant indices of a lone `index` as one C-contiguous int64 position per element
    of their broadcast shape along the indexed axes merged (row-major); IndexError when one is
    out of its axis' range."""
    op = problem.body[0]
    shape = problem.shape(op.operands[0])
    axes = [a % len(shape) for a in problem.attrs(op)["axes"]]
    indices = np.broadcast_arrays(*(problem.constants[v] for v in op.operands[1:]))
    flat = np.zeros(indices[0].shape, np.int64)
    for axis, index in zip(axes, indices, strict=True):
        n = shape[axis]
        if index.size and (index.min() < -n or index.max() >= n):
            raise IndexError(f"an index of axis {axis} outside [-{n}, {n})")
        flat = flat * n + np.where(index < 0, index + n, index)
    return np.ascontiguousarray(flat.reshape(-1), np.int64)


def build_index(problem: Problem, ctx: Context) -> Kernel:
    op = problem.body[0]
    shape = problem.shape(op.operands[0])
    axes = [a % len(shape) for a in problem.attrs(op)["axes"]]
    merged = (*shape[:axes[0]], math.prod(shape[a] for a in axes), *shape[axes[-1] + 1:])
    if any(v not in problem.constants for v in op.operands[1:]):
        return _index_at_run_time(problem, ctx, axes, merged)
    flat = merged_positions(problem)
    rows = (*shape[:axes[0]], flat.size, *shape[axes[-1] + 1:])

    def run(x: np.ndarray, *rest: np.ndarray) -> None:
        out = rest[-1]  # the index operands come first: constants, already in `flat`
        np.take(x.reshape(merged), flat, axis=axes[0], out=out.reshape(rows), mode="raise")

    def calls(x: np.ndarray, *rest: np.ndarray):
        out = rest[-1]
        if not (x.flags.c_contiguous and out.flags.c_contiguous):
            return None
        call = copy_call(out.reshape(rows), x.reshape(merged), index=flat, axis=axes[0],
                         side="src")
        return None if call is None else [call]

    return Kernel(run, "// index by constants: a native indexed copy", calls=calls)


def _index_at_run_time(problem: Problem, ctx: Context, axes: list[int],
                       merged: tuple[int, ...]) -> Kernel:
    """An `index` by i64 tensors computed at run time: a scalar loop writes each element's
    merged position (an index out of its axis' range: the merged axis' length, which the
    copy refuses), then one native gather by them."""
    op = problem.body[0]
    shape = problem.shape(op.operands[0])
    wide = tuple(broadcast_shapes("index", *(problem.shape(v) for v in op.operands[1:])))
    nodes: list[Node] = []

    def node(name: str, *operands: int, dtype: str = "i64", value: int | None = None) -> int:
        start_step = (0.0, 1.0) if value is None else (float(value), 0.0)  # step 0: a constant
        nodes.append(Node(name, operands, dtype, start_step=start_step))
        return len(axes) + len(nodes) - 1

    flat = ok = None
    for j, axis in enumerate(axes):  # value j is index tensor j
        n, zero = node("arange", value=shape[axis]), node("arange", value=0)
        wrapped = node("where", node("lt", j, zero, dtype="bool"), node("add", j, n), j)
        inside = node("and", node("ge", wrapped, zero, dtype="bool"),
                      node("lt", wrapped, n, dtype="bool"), dtype="bool")
        ok = inside if ok is None else node("and", ok, inside, dtype="bool")
        flat = wrapped if flat is None else node("add", node("mul", flat, n), wrapped)
    beyond = node("arange", value=merged[axes[0]])
    node("where", ok, flat, beyond)
    group = ScalarGroup(wide, tuple(("i64", element_strides(problem.shape(v), wide))
                                    for v in op.operands[1:]),
                        tuple(nodes), (len(axes) + len(nodes) - 1,))
    positions = scalar_kernel(group, "tf_index_positions", ctx.target)
    rows = (*shape[:axes[0]], math.prod(wide), *shape[axes[-1] + 1:])
    key = (slice(None),) * axes[0]

    def run(x: np.ndarray, *rest: np.ndarray) -> None:
        out = rest[-1]
        out[...] = x[(*key, *rest[:-1])]  # NumPy raises an index out of range

    def calls(x: np.ndarray, *rest: np.ndarray):
        *indices, out = rest
        if not all(a.flags.c_contiguous for a in (x, out, *indices)):
            return None
        at = np.empty(math.prod(wide), np.int64)  # written by the loop before the copy reads
        call = copy_call(out.reshape(rows), x.reshape(merged), index=at, axis=axes[0],
                         side="src")
        if call is None:
            return None
        fill = NativeCall(positions.native, (*indices, at, *positions.bound),
                          positions.bound, scratch=(at,))
        return [fill, call]

    return Kernel(run, "// index by run-time tensors: a scalar loop of positions, then a "
                  "native indexed copy", calls=calls)


def index_put_refusal(problem: Problem) -> str | None:
    """Why a lone `index_put` has no native scatter here (None: it has)."""
    op = problem.body[0]
    if len(op.operands) != 3 or len(problem.attrs(op)["axes"]) != 1:
        return "index_put by several index tensors (one along one axis only)"
    return None


def build_index_put(problem: Problem, ctx: Context) -> Kernel:
    op = problem.body[0]
    attrs = problem.attrs(op)
    (axis,), accumulate = attrs["axes"], bool(attrs.get("accumulate", False))

    def scatter(x: np.ndarray, values: np.ndarray, index: np.ndarray, out: np.ndarray,
                status: np.ndarray):
        np.copyto(out, x)  # x broadcast from a scalar (zeros): a fill
        return scatter_call(out, values, index, axis, accumulate, status)

    def run(x: np.ndarray, values: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
        key = index_key("index_put", out.shape, [axis], [index])  # ShapeError out of range
        call = scatter(x, values, index, out, np.zeros(1, np.int64))
        if call is None:
            put(out, values, key, accumulate)
        else:
            call()

    def calls(x: np.ndarray, values: np.ndarray, index: np.ndarray, out: np.ndarray):
        fill = copy_call(out, x)
        put_call = scatter_call(out, values, index, axis, accumulate, fixed=True)
        return None if fill is None or put_call is None else [fill, put_call]

    return Kernel(run, f"// index_put: a native copy, then a native scatter"
                  f"{' adding' if accumulate else ''}", strided=True, calls=calls)


BUILDERS = {"concat": build_concat, "gather": build_gather, "index": build_index,
            "index_put": build_index_put}
