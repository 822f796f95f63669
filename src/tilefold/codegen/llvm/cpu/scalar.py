"""Scalar element loops for small elementwise groups over integers (index arithmetic).

A model's index computations (a KV cache's write position `arange(n) + length`, the length's
`+= n`, positions cast to float for rotary embeddings) are elementwise ops on a few int64
values, which the vectorized kernel IR (f32 math) does not take. This generator emits one loop
over the output's elements that evaluates the group's ops in each value's own dtype: integers
wrap as NumPy's do, float32/float64 ops are IEEE's (the reference's f64-then-round for add, sub
and mul), comparisons give bools. Operands broadcast by strides (0 where broadcast). `arange` is a
node without operands: start + step * i along the output's last axis (a lone `arange(n)` of a
symbolic length is a group of its own, native so that a decode step has no Python in it); with
step 0 it is a constant (`dim_size`, a size the plan knows). An input of dtype "" is not read.

`name(a0, ..., an, sizes)` takes the inputs then the outputs as NumPy array objects (their data
pointers read natively, as row kernels do), all C-contiguous as the compiled graph hands them,
then an int64 array of the sizes: the element count, the output's dims, each input's element
strides, and the integer constants (`dim_size`, step-0 aranges). The code is the same for every
shape of a group of the same rank and ops (the symbol follows that), so a symbolic length runs
one compiled loop, and an exported artifact one class of sizes for it.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.cpu.rowkernel import RowKernel
from tilefold.codegen.llvm.gemm.abi import DATA_OFFSET
from tilefold.errors import UnsupportedError
from tilefold.runtime import compile_generated, emit_assembly, source_digest
from tilefold.target import Target

# Element types by the IR's dtype names.
TYPES: dict[str, ir.Type] = {"i64": u.i64, "i32": u.i32, "i16": ir.IntType(16),
                             "i8": u.i8, "u8": u.i8, "bool": u.i8, "f32": u.f32,
                             "f64": ir.DoubleType()}
UNSIGNED = {"u8", "bool"}
INT_BINARY = {"add": "add", "sub": "sub", "mul": "mul"}
FLOAT_BINARY = {"add": "fadd", "sub": "fsub", "mul": "fmul"}
COMPARE = {"eq": ("==", "oeq"), "ne": ("!=", "une"), "lt": ("<", "olt"), "le": ("<=", "ole"),
           "gt": (">", "ogt"), "ge": (">=", "oge")}
OPS = frozenset({*INT_BINARY, *COMPARE, "max", "min", "neg", "abs", "relu", "where", "cast",
                 "and", "or", "arange", "dim_size"})


@dataclass(frozen=True)
class Node:
    """One op of the group: its name, operand indices (into the values list), dtype, attrs."""

    op: str
    operands: tuple[int, ...]
    dtype: str
    cast_from: str = ""
    start_step: tuple[float, float] = (0.0, 1.0)  # arange's
    slot: int = -1  # an integer constant read from the sizes at this slot (the loop's code)


@dataclass(frozen=True)
class ScalarGroup:
    """A group as data: values 0..n_in-1 are the inputs (dtype, strides over the output's
    shape, in elements), then one value per node; `outputs` are value indices."""

    shape: tuple[int, ...]
    inputs: tuple[tuple[str, tuple[int, ...]], ...]
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]


def refusal(op: str, dtypes: Sequence[str], result: str) -> str | None:
    """Why the scalar loop cannot evaluate `op` on these operand dtypes, or None."""
    if op not in OPS:
        return f"{op} has no scalar form"
    if any(d not in TYPES for d in (*dtypes, result)):
        return f"{op} on {', '.join(dtypes)} (scalar loops take i64/i32/i16/i8/u8/bool/f32/f64)"
    if op == "arange" and result not in ("i64", "i32", "f32", "f64"):
        return f"arange of {result}"
    if op == "cast" and dtypes[0] in ("f32", "f64") and result not in ("f32", "f64"):
        return "float to integer casts (saturating) have no scalar form"
    if op in ("neg", "abs", "relu", "max", "min") and result == "bool":
        return f"{op} of bools"
    return None


def _value(b: ir.IRBuilder, node: Node, args: list[ir.Value], dtypes: list[str],
           last: ir.Value) -> ir.Value:
    """`node`'s value at the element whose index along the output's last axis is `last`."""
    op, out = node.op, node.dtype
    is_float = out in ("f32", "f64")
    src = dtypes[0] if dtypes else out
    if node.slot >= 0:  # a constant of this shape, one of the sizes: `last` is that value
        if is_float:
            value = b.sitofp(last, ir.DoubleType())
            return value if out == "f64" else b.fptrunc(value, u.f32)
        return b.trunc(last, TYPES[out]) if TYPES[out].width < 64 else last
    if op == "arange":  # as the reference: start + step * i in f64, then the dtype
        start, step = (ir.Constant(ir.DoubleType(), float(v)) for v in node.start_step)
        value = b.fadd(start, b.fmul(step, b.sitofp(last, ir.DoubleType())))
        if is_float:
            return value if out == "f64" else b.fptrunc(value, u.f32)
        return b.fptosi(value, TYPES[out])
    if op == "cast":
        (x,) = args
        if src == out:
            return x
        if out == "bool":
            return b.zext(b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0))
                          if src in ("f32", "f64") else b.icmp_signed("!=", x, ir.Constant(
                              x.type, 0)), u.i8)
        if is_float:
            if src in ("f32", "f64"):
                return b.fpext(x, TYPES[out]) if out == "f64" else b.fptrunc(x, TYPES[out])
            wide = (b.uitofp if src in UNSIGNED else b.sitofp)(x, ir.DoubleType())
            return wide if out == "f64" else b.fptrunc(wide, u.f32)  # as the reference rounds
        bits, width = TYPES[src].width, TYPES[out].width
        if bits == width:
            return x
        if bits > width:
            return b.trunc(x, TYPES[out])
        return (b.zext if src in UNSIGNED else b.sext)(x, TYPES[out])
    if op in COMPARE:
        x, y = args
        if src in ("f32", "f64"):
            flag = b.fcmp_ordered(COMPARE[op][1], x, y) if op != "ne" else \
                b.fcmp_unordered("!=", x, y)
        elif src in UNSIGNED:
            flag = b.icmp_unsigned(COMPARE[op][0], x, y)
        else:
            flag = b.icmp_signed(COMPARE[op][0], x, y)
        return b.zext(flag, u.i8)
    if op in ("and", "or"):
        x, y = (b.icmp_unsigned("!=", a, ir.Constant(u.i8, 0)) for a in args)
        return b.zext(b.and_(x, y) if op == "and" else b.or_(x, y), u.i8)
    if op == "where":
        c, x, y = args
        return b.select(b.icmp_unsigned("!=", c, ir.Constant(u.i8, 0)), x, y)
    if op in INT_BINARY:
        x, y = args
        return getattr(b, FLOAT_BINARY[op] if is_float else INT_BINARY[op])(x, y)
    zero = ir.Constant(TYPES[out], 0.0 if is_float else 0)
    if op == "neg":
        return b.fneg(args[0]) if is_float else b.sub(zero, args[0])
    if op in ("max", "min", "relu"):
        x, y = (args[0], zero) if op == "relu" else args
        want = ">" if op in ("max", "relu") else "<"
        if is_float:  # NaN propagates, as np.maximum's
            pick = b.fcmp_unordered(want, x, y)
            return b.select(b.fcmp_unordered("uno", x, x), x, b.select(pick, x, y))
        flag = (b.icmp_unsigned if out in UNSIGNED else b.icmp_signed)(want, x, y)
        return b.select(flag, x, y)
    if op == "abs":
        x = args[0]
        if is_float:
            fabs = u.intrinsic(b.module, f"llvm.fabs.{out}", x.type, [x.type])
            return b.call(fabs, [x])
        if out in UNSIGNED:
            return x
        return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
    raise UnsupportedError(f"scalar loop: {op}")


def _integral(node: Node) -> bool:
    """Whether `node` is an integer constant (a step-0 arange of an integral start)."""
    start, step = node.start_step
    return node.op == "arange" and step == 0 and float(start).is_integer()


def split_sizes(group: ScalarGroup) -> tuple[ScalarGroup, np.ndarray]:
    """`group` without its sizes (the loop's code: shape and strides zeros, each integer
    constant a slot), and the int64 sizes the loop reads: the element count, the dims, each
    input's strides, the constants."""
    rank = len(group.shape)
    sizes = [math.prod(group.shape), *group.shape]
    for _, strides in group.inputs:
        sizes += strides
    nodes = []
    for node in group.nodes:
        if _integral(node):
            nodes.append(replace(node, start_step=(0.0, 0.0), slot=len(sizes)))
            sizes.append(int(node.start_step[0]))
        else:
            nodes.append(node)
    code = ScalarGroup((0,) * rank, tuple((d, (0,) * rank) for d, _ in group.inputs),
                       tuple(nodes), group.outputs)
    return code, np.array(sizes, np.int64)


def scalar_ir(code: ScalarGroup, name: str, triple: str) -> str:
    """The loop of `code` (`split_sizes`'s), reading its sizes at run time."""
    module = ir.Module(name=name)
    module.triple = triple
    n_in, n_out, rank = len(code.inputs), len(code.outputs), len(code.shape)
    i8p = u.i8.as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8p] * (n_in + n_out + 1)),
                     name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    data = [b.load(b.bitcast(b.gep(obj, [u.const(DATA_OFFSET)]), u.i64.as_pointer()))
            for obj in fn.args]
    sizes = b.inttoptr(data[-1], u.i64.as_pointer(), name="sizes")

    def size(slot: int) -> ir.Value:
        return b.load(u.gep(b, sizes, slot))
    dtypes = [d for d, _ in code.inputs] + [n.dtype for n in code.nodes]
    dims = [size(1 + d) for d in range(rank)]
    strides = [[size(1 + rank * (1 + k) + d) for d in range(rank)] for k in range(n_in)]
    # Rows of the last axis: a row's index is split by the other dims once, then each element
    # of the row steps along the last axis (no division per element).
    width = dims[-1] if rank else u.const(1)
    rows = b.sdiv(size(0), b.select(b.icmp_signed("==", width, u.const(0)), u.const(1), width))
    with u.for_range(b, 0, rows, name="r") as r:
        index, rest = [], r
        for d in reversed(dims[:-1]):
            index.append(b.srem(rest, d))
            rest = b.sdiv(rest, d)
        index.reverse()
        bases = []
        for k in range(n_in):
            base = u.const(0)
            for i, stride in zip(index, strides[k], strict=False):
                base = b.add(base, b.mul(i, stride))
            bases.append(base)
        with u.for_range(b, 0, width, name="c") as c:
            values: list[ir.Value | None] = []
            for k, ((dtype, _), ptr) in enumerate(zip(code.inputs, data, strict=False)):
                if not dtype:  # only its shape was asked for (`dim_size`)
                    values.append(None)
                    continue
                offset = b.add(bases[k], b.mul(c, strides[k][-1])) if rank else bases[k]
                at = b.gep(b.inttoptr(ptr, TYPES[dtype].as_pointer()), [offset])
                values.append(b.load(at))
            for node in code.nodes:
                last = size(node.slot) if node.slot >= 0 else c
                values.append(_value(b, node, [values[i] for i in node.operands],
                                     [dtypes[i] for i in node.operands], last))
            e = b.add(b.mul(r, width), c)
            for k, v in enumerate(code.outputs):
                at = b.gep(b.inttoptr(data[n_in + k], TYPES[dtypes[v]].as_pointer()), [e])
                b.store(values[v], at)
    b.ret_void()
    return str(module)


def scalar_kernel(group: ScalarGroup, prefix: str, target: Target) -> RowKernel:
    """The compiled loop (cached on disk by its code), called as a row kernel is (array
    objects in, then its sizes, bound); one symbol, `prefix` and a hash of the code, for
    every shape."""
    if DATA_OFFSET < 0:
        raise UnsupportedError("this Python keeps NumPy data pointers where tilefold cannot "
                               "read them; native kernels are unavailable (extern still works)")
    code, sizes = split_sizes(group)
    key = f"{source_digest(__name__)}|{code!r}"
    name = f"{prefix}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def make_ir() -> str:
        return scalar_ir(code, name, target.triple)

    compiled = compile_generated(f"{key}|{name}", make_ir, target, name=name)
    nargs = len(group.inputs) + len(group.outputs) + 1
    fn = compiled.function(name, None, *([ctypes.py_object] * nargs))
    return RowKernel(fn, make_ir, lambda: emit_assembly(make_ir(), target), (sizes,))
