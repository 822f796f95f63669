"""Scalar element loops for small elementwise groups over integers (index arithmetic).

A model's index computations (a KV cache's write position `arange(n) + length`, the length's
`+= n`, positions cast to float for rotary embeddings) are elementwise ops on a few int64
values, which the vectorized kernel IR (f32 math) does not take. This generator emits one loop
over the output's elements that evaluates the group's ops in each value's own dtype: integers
wrap as NumPy's do, float32/float64 ops are IEEE's (the reference's f64-then-round for add, sub
and mul), comparisons give bools. Operands broadcast by strides fixed at build time. `arange` is a
node without operands: start + step * i along the output's last axis (a lone `arange(n)` of a
symbolic length is a group of its own, native so that a decode step has no Python in it); with
step 0 it is a constant (`dim_size`, a size the plan knows). An input of dtype "" is not read.

`name(a0, ..., an)` takes the inputs then the outputs as NumPy array objects (their data
pointers read natively, as row kernels do), all C-contiguous as the compiled graph hands them.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass

from llvmlite import ir

from tilefold.codegen import llvm_util as u
from tilefold.codegen.cpu.rowkernel import RowKernel
from tilefold.codegen.gemm.abi import DATA_OFFSET
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


def scalar_ir(group: ScalarGroup, name: str, triple: str) -> str:
    module = ir.Module(name=name)
    module.triple = triple
    n_in, n_out = len(group.inputs), len(group.outputs)
    i8p = u.i8.as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8p] * (n_in + n_out)), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    data = [b.load(b.bitcast(b.gep(obj, [u.const(DATA_OFFSET)]), u.i64.as_pointer()))
            for obj in fn.args]
    dtypes = [d for d, _ in group.inputs] + [n.dtype for n in group.nodes]
    total = math.prod(group.shape)
    dims = group.shape
    with u.for_range(b, 0, total, name="e") as e:
        index, rest = [], e
        for d in reversed(dims):
            index.append(b.srem(rest, u.const(d)))
            rest = b.sdiv(rest, u.const(d))
        index.reverse()
        values: list[ir.Value | None] = []
        for (dtype, strides), ptr in zip(group.inputs, data, strict=False):
            if not dtype:  # only its shape was asked for (`dim_size`)
                values.append(None)
                continue
            offset = u.const(0)
            for i, s in zip(index, strides, strict=True):
                if s:
                    offset = b.add(offset, b.mul(i, u.const(s)))
            at = b.gep(b.inttoptr(ptr, TYPES[dtype].as_pointer()), [offset])
            values.append(b.load(at))
        for node in group.nodes:
            values.append(_value(b, node, [values[i] for i in node.operands],
                                 [dtypes[i] for i in node.operands],
                                 index[-1] if index else u.const(0)))
        for k, v in enumerate(group.outputs):
            at = b.gep(b.inttoptr(data[n_in + k], TYPES[dtypes[v]].as_pointer()), [e])
            b.store(values[v], at)
    b.ret_void()
    return str(module)


def scalar_kernel(group: ScalarGroup, name: str, target: Target) -> RowKernel:
    """The compiled loop (cached on disk by the group's description), called as a row kernel
    is (array objects in)."""
    if DATA_OFFSET < 0:
        raise UnsupportedError("this Python keeps NumPy data pointers where tilefold cannot "
                               "read them; native kernels are unavailable (extern still works)")

    def make_ir() -> str:
        return scalar_ir(group, name, target.triple)

    compiled = compile_generated(f"{source_digest(__name__)}|{group!r}|{name}", make_ir, target,
                                 name=name)
    nargs = len(group.inputs) + len(group.outputs)
    fn = compiled.function(name, None, *([ctypes.py_object] * nargs))
    return RowKernel(fn, make_ir, lambda: emit_assembly(make_ir(), target))
