"""A native strided copy, optionally indexed along one axis: copies, concatenation, gathers and
in-place row writes (`index_put`) without Python.

`tf_copy_<bytes>(i64* params)` copies the elements of an iteration space of up to `MAX_RANK`
dims from one strided array to another: element (i0, ..., in) of the source goes to element
(i0, ..., in) of the destination, except along the indexed axis, where one side (the
destination for a scatter, the source for a gather) is at `index[i]` instead (negative indices
count from the end). An index outside its axis is not followed: the kernel sets the status
word to 1 and copies the rest, so the caller can raise a clear error. The innermost dim is
one `memcpy` when both sides are contiguous along it, and a vectorized fill when the source
repeats one value along it (a broadcast; zeros, an embedding gradient's, a `memset`).

`tf_copy_add_<dtype>` is the same walk adding the source to the destination instead of
overwriting it (`copy_call(..., accumulate=True)`): an accumulating `index_put`, an embedding's
gradient, each row of values added to its index's row in the order the index lists them, so a
repeated index gets the same sums in the same order as `np.add.at` (bit for bit).
`scatter_call` flattens an `index_put` (one index tensor of any rank along one axis) into one.

`copy_call(dst, src, ...)` returns the call for a fixed pair of arrays (a plan's buffers), for
replay (`runtime/replay.py`): the addresses are raw data pointers, fixed with the arrays.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import math

import numpy as np
from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.errors import UnsupportedError
from tilefold.runtime import compile_generated, source_digest
from tilefold.runtime.replay import NativeCall
from tilefold.target import host_target

MAX_RANK = 6


class CopyParam(enum.IntEnum):
    """Slots of `tf_copy`'s int64 parameter block (DIMS, DST_STRIDES and SRC_STRIDES each
    MAX_RANK long, in bytes for strides)."""

    DST = 0
    SRC = 1
    INDEX = 2  # an int64 array, or 0
    AXIS = 3  # the indexed axis (never the innermost)
    SIDE = 4  # 1: the index picks destination positions (scatter); 2: source ones (gather)
    LIMIT = 5  # the indexed axis' length on the indexed side
    STATUS = 6  # address of an int64 set to 1 on an index out of range
    CONTIGUOUS = 7  # 1 when both sides are contiguous along the innermost dim
    DIMS = 8
    DST_STRIDES = DIMS + MAX_RANK
    SRC_STRIDES = DST_STRIDES + MAX_RANK
    SIZE = SRC_STRIDES + MAX_RANK


SIDES = {None: 0, "dst": 1, "src": 2}
# The status word copies set on an index out of range (per process: a replay checks and clears
# it after running; `copy_call(status=...)` gives a call its own).
OUT_OF_RANGE = np.zeros(1, np.int64)
_NO_INDEX = np.zeros(1, np.int64)  # what the kernel's index pointer reads when none is used


# Element types the accumulating copy adds in (`tf_copy_add_<name>`).
ADDS = {"float32": ir.FloatType(), "float64": ir.DoubleType(), "int32": ir.IntType(32),
        "int64": ir.IntType(64)}


def copy_ir(itemsize: int, name: str, triple: str, add: str | None = None) -> str:
    """The copy kernel; with `add` (a key of ADDS), destination elements become
    destination + source in that type."""
    module = ir.Module(name=name)
    module.triple = triple
    i8p, i64p = u.i8.as_pointer(), u.i64.as_pointer()
    elem = ir.IntType(8 * itemsize) if add is None else ADDS[add]
    memcpy = u.intrinsic(module, "llvm.memcpy.p0i8.p0i8.i64", ir.VoidType(),
                         [i8p, i8p, u.i64, ir.IntType(1)])
    memset = u.intrinsic(module, "llvm.memset.p0i8.i64", ir.VoidType(),
                         [i8p, u.i8, u.i64, ir.IntType(1)])
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i64p]), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    params = fn.args[0]

    def param(slot: int) -> ir.Value:
        return b.load(u.gep(b, params, slot))

    dst0 = b.inttoptr(param(CopyParam.DST), i8p)
    src0 = b.inttoptr(param(CopyParam.SRC), i8p)
    index = b.inttoptr(param(CopyParam.INDEX), i64p)
    axis, side, limit = (param(s) for s in (CopyParam.AXIS, CopyParam.SIDE, CopyParam.LIMIT))
    status = b.inttoptr(param(CopyParam.STATUS), i64p)
    contiguous = b.icmp_signed("!=", param(CopyParam.CONTIGUOUS), u.const(0))
    dims = [param(CopyParam.DIMS + d) for d in range(MAX_RANK)]
    dstr = [param(CopyParam.DST_STRIDES + d) for d in range(MAX_RANK)]
    sstr = [param(CopyParam.SRC_STRIDES + d) for d in range(MAX_RANK)]
    inner, inner_d, inner_s = dims[-1], dstr[-1], sstr[-1]
    run_bytes = b.mul(inner, u.const(itemsize))
    fill = b.and_(b.icmp_signed("==", inner_s, u.const(0)),
                  b.icmp_signed("==", inner_d, u.const(itemsize)))

    def level(d: int, doff: ir.Value, soff: ir.Value) -> None:
        """The loop over dim `d` (outer dims nest; the innermost is a run)."""
        if d == MAX_RANK - 1:
            dst, src = b.gep(dst0, [doff]), b.gep(src0, [soff])
            if add is not None:  # element by element, in order
                with u.for_range(b, 0, inner, name="e") as e:
                    to = b.bitcast(b.gep(dst, [b.mul(e, inner_d)]), elem.as_pointer())
                    value = b.load(b.bitcast(b.gep(src, [b.mul(e, inner_s)]),
                                             elem.as_pointer()))
                    plus = b.fadd if isinstance(elem, (ir.FloatType, ir.DoubleType)) else b.add
                    b.store(plus(b.load(to), value), to)
                return
            with b.if_else(contiguous) as (whole, other):
                with whole:
                    b.call(memcpy, [dst, src, run_bytes, ir.Constant(ir.IntType(1), 0)])
                with other, b.if_else(fill) as (filled, strided):
                    with filled:  # one value along a contiguous run: zeros a memset
                        bits = b.load(b.bitcast(src, ir.IntType(8 * itemsize).as_pointer()))
                        with b.if_else(b.icmp_unsigned("==", bits, bits.type(0))) as (
                                zero, value):
                            with zero:
                                b.call(memset, [dst, ir.Constant(u.i8, 0), run_bytes,
                                                ir.Constant(ir.IntType(1), 0)])
                            with value, u.for_range(b, 0, inner, name="f") as e:
                                b.store(bits, b.gep(b.bitcast(dst, bits.type.as_pointer()),
                                                    [e]))
                    with strided, u.for_range(b, 0, inner, name="e") as e:
                        value = b.load(b.bitcast(b.gep(src, [b.mul(e, inner_s)]),
                                                 elem.as_pointer()))
                        b.store(value, b.bitcast(b.gep(dst, [b.mul(e, inner_d)]),
                                                 elem.as_pointer()))
            return
        with u.for_range(b, 0, dims[d], name=f"d{d}") as i:
            here = b.icmp_signed("==", axis, u.const(d))
            picked = b.load(u.gep(b, index, b.select(here, i, u.const(0))))
            wrapped = b.select(b.icmp_signed("<", picked, u.const(0)), b.add(picked, limit),
                               picked)
            inside = b.and_(b.icmp_signed(">=", wrapped, u.const(0)),
                            b.icmp_signed("<", wrapped, limit))
            di = b.select(b.and_(here, b.icmp_signed("==", side, u.const(1))), wrapped, i)
            si = b.select(b.and_(here, b.icmp_signed("==", side, u.const(2))), wrapped, i)
            with b.if_else(b.or_(b.not_(here), inside)) as (good, bad):
                with good:
                    level(d + 1, b.add(doff, b.mul(di, dstr[d])),
                          b.add(soff, b.mul(si, sstr[d])))
                with bad:
                    b.store(u.const(1), status)

    level(0, u.const(0), u.const(0))
    b.ret_void()
    return str(module)


@functools.cache
def copy_function(itemsize: int, add: str | None = None):
    """The ctypes entry `tf_copy_<itemsize>(params)` for this host (compiled once, cached);
    with `add`, `tf_copy_add_<add>`, which adds instead of copying."""
    if itemsize not in (1, 2, 4, 8):
        raise UnsupportedError(f"native copy: elements of {itemsize} bytes (1, 2, 4 or 8 only)")
    target = host_target()
    name = f"tf_copy_{itemsize}" if add is None else f"tf_copy_add_{add}"
    module = compile_generated(f"{source_digest(__name__, 'tilefold.codegen.llvm')}|{name}",
                               lambda: copy_ir(itemsize, name, target.triple, add), target,
                               name=name, portable=True)
    return module.function(name, None, ctypes.c_void_p)


def copy_call(dst: np.ndarray, src: np.ndarray, *, index: np.ndarray | None = None,
              axis: int = 0, side: str | None = None, status: np.ndarray = OUT_OF_RANGE,
              accumulate: bool = False) -> NativeCall | None:
    """The native call copying `src` into `dst` (same shape: the iteration space), or with
    `side` "dst" (scatter: `dst` positions along `axis` are `index`) or "src" (gather), where
    `index` is a 1-D int64 array as long as the iteration space's `axis`; with `accumulate`,
    adding `src` to `dst` instead (`dst` and `src` of one dtype in ADDS). None when this copy
    has no native form (dtype sizes, rank above MAX_RANK, an index that is not contiguous int64
    or overlapping memory)."""
    if dst.dtype.itemsize != src.dtype.itemsize or dst.dtype.itemsize not in (1, 2, 4, 8):
        return None
    if accumulate and (dst.dtype != src.dtype or dst.dtype.name not in ADDS):
        return None
    if not dst.flags.writeable or (side is None and dst.shape != src.shape):
        return None
    if dst.size == 0:
        return None
    shape = list(dst.shape if side != "dst" else src.shape)
    dstr, sstr = list(dst.strides), list(src.strides)
    limit = 0
    if side is not None:
        if index is None or index.dtype != np.int64 or index.ndim != 1 or \
                not index.flags.c_contiguous or index.shape[0] != shape[axis]:
            return None
        limit = (dst if side == "dst" else src).shape[axis]
        if np.may_share_memory(dst, src):
            return None
    shape, dstr, sstr, axis = _coalesce(shape, dstr, sstr, axis if side is not None else None)
    if axis == len(shape) - 1:  # keep the indexed axis off the innermost dim
        shape, dstr, sstr = [*shape, 1], [*dstr, dst.itemsize], [*sstr, src.itemsize]
    if len(shape) > MAX_RANK:
        return None
    pad = MAX_RANK - len(shape)
    shape, dstr, sstr = [1] * pad + shape, [0] * pad + dstr, [0] * pad + sstr
    axis = axis + pad if side is not None else MAX_RANK
    item = dst.itemsize
    params = np.zeros(CopyParam.SIZE, np.int64)
    params[CopyParam.DST] = dst.ctypes.data
    params[CopyParam.SRC] = src.ctypes.data
    params[CopyParam.INDEX] = (index if side is not None else _NO_INDEX).ctypes.data
    params[CopyParam.AXIS] = axis
    params[CopyParam.SIDE] = SIDES[side]
    params[CopyParam.LIMIT] = limit
    params[CopyParam.STATUS] = status.ctypes.data
    params[CopyParam.CONTIGUOUS] = int(dstr[-1] == item and sstr[-1] == item)
    params[CopyParam.DIMS:CopyParam.DIMS + MAX_RANK] = shape
    params[CopyParam.DST_STRIDES:CopyParam.DST_STRIDES + MAX_RANK] = dstr
    params[CopyParam.SRC_STRIDES:CopyParam.SRC_STRIDES + MAX_RANK] = sstr
    if math.prod(shape) == 0:
        return None
    function = copy_function(item, dst.dtype.name if accumulate else None)
    return NativeCall(function, (params.ctypes.data,),
                      (params, dst, src, status, index if side is not None else _NO_INDEX))


def scatter_call(out: np.ndarray, values: np.ndarray, index: np.ndarray, axis: int,
                 accumulate: bool, status: np.ndarray = OUT_OF_RANGE, fixed: bool = False
                 ) -> NativeCall | None:
    """`index_put` of `values` into `out` by one index tensor (any rank, integers) along
    `axis` as one native scatter (`out[..., index, ...] = values`, or `+=` with `accumulate`),
    the index flattened in C order as NumPy walks it; None without a native form, and with
    `fixed` (a call replayed on the same arrays) also where `index` or `values` had to be
    copied into that form."""
    axis %= max(out.ndim, 1)
    flat = np.ascontiguousarray(index.reshape(-1), np.int64)
    picked = (*out.shape[:axis], *index.shape, *out.shape[axis + 1:])
    rows = (*out.shape[:axis], flat.size, *out.shape[axis + 1:])
    try:
        given, values = values, np.broadcast_to(values, picked).reshape(rows)  # a copy if
    except ValueError:  # broadcast
        return None
    if values.dtype != out.dtype or flat.size == 0:
        return None
    if fixed and not (np.shares_memory(flat, index) and np.shares_memory(values, given)):
        return None
    return copy_call(out, values, index=flat, axis=axis, side="dst", status=status,
                     accumulate=accumulate)


def _coalesce(shape: list[int], dstr: list[int], sstr: list[int], axis: int | None
              ) -> tuple[list[int], list[int], list[int], int | None]:
    """Merge neighbouring dims that both sides step through as one (a contiguous copy becomes
    one run), never the indexed axis; size-1 dims go. Returns the indexed axis' new place."""
    dims = [(n, d, s, i == axis) for i, (n, d, s) in enumerate(zip(shape, dstr, sstr,
                                                                   strict=True))
            if n != 1 or i == axis]
    merged: list[list] = []
    for n, d, s, indexed in dims:
        if merged and not indexed and not merged[-1][3] and \
                merged[-1][1] == d * n and merged[-1][2] == s * n:
            merged[-1][0] *= n
            merged[-1][1], merged[-1][2] = d, s
        else:
            merged.append([n, d, s, indexed])
    if not merged:
        merged = [[1, 0, 0, False]]
    new_axis = next((i for i, m in enumerate(merged) if m[3]), None)
    return ([m[0] for m in merged], [m[1] for m in merged], [m[2] for m in merged], new_axis)
