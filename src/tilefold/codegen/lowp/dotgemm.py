"""The low-precision GEMM module in LLVM IR: register-tile micro-kernel, cache loops, epilogue.

`tf_dotgemm(params, A_packed, B_packed, C, unused)` computes C = A @ B from operands packed by
`tilefold.codegen.lowp.dotpack` (32-bit k-group words: MR-row and NR-column panels over all of
K). Each thread takes a rectangle of C; K is blocked by KC with partial sums kept in C, and the
last block applies the epilogue in registers: subtract the signed-A compensation (int), then
optionally dequantize (row scale * column scale + bias) to f32 in place.
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen import llvm_util as u
from tilefold.codegen.gemm.abi import ParamBlock, emit_entry, emit_worker
from tilefold.codegen.lowp.dot import DOT_STEPS
from tilefold.codegen.lowp.kernels import DotKernel
from tilefold.target import Target

ENTRY = "tf_dotgemm"
_W = u.i32.as_pointer()
_FP = u.f32.as_pointer()
UK_TYPE = ir.FunctionType(u.void, [u.i64, _W, _W, _W, u.i64, u.i32, u.i32, u.i64, u.i64, _W,
                                   _FP, _FP, _FP])


class DParam(ParamBlock):
    """Slots of the int64 parameter block of `tf_dotgemm`."""

    M = 0
    N = 1
    KG = 2
    LDC = 3
    MC = 4
    KC = 5
    TM = 6
    TN = 7
    THREADS = 8
    DATA_OFFSET = 9
    COMP = 10
    ROW_SCALE = 11
    COL_SCALE = 12
    BIAS = 13


def _emit_microkernel(module: ir.Module, k: DotKernel, dequant: bool) -> ir.Function:
    """uk(kc, a, b, c, ldc, first, last, rows, cols, comp, rs, cs, bias) on one MR x NR tile."""
    fn = ir.Function(module, UK_TYPE, name=f"tf_uk_{k.name}")
    fn.linkage = "internal"
    kc, a, bp, c, ldc, first, last, rows, cols, comp, rs, cs, bias = fn.args
    for p in (a, bp, c):
        p.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    lanes, nv, mr = k.lanes, k.nv, k.mr
    wty = u.vec(u.i32, lanes)
    accty = u.vec(u.f32, lanes) if k.acc_is_float else wty
    zero = ir.Constant(accty, [0.0 if k.acc_is_float else 0] * lanes)
    step = DOT_STEPS[k.dot]
    with u.for_range_carry(b, u.const(0), kc, 1, [zero] * (mr * nv), "k") as loop:
        bv = [b.load(b.bitcast(u.gep(b, bp, b.add(b.mul(loop.index, u.const(k.nr)),
                                                  u.const(v * lanes))), wty.as_pointer()),
                     align=4) for v in range(nv)]
        acc = list(loop.values)
        for i in range(mr):
            aw = b.load(u.gep(b, a, b.add(b.mul(loop.index, u.const(mr)), u.const(i))), align=4)
            av = u.splat(b, aw, lanes)
            for v in range(nv):
                acc[i * nv + v] = step(b, acc[i * nv + v], av, bv[v])
        loop.next = acc
    _epilogue(b, k, dequant, loop.result, c, ldc, first, last, rows, cols, comp, rs, cs, bias)
    return fn


def _masked(b, name: str, ty, args):
    lanes = ty.count
    mask_ty = u.vec(u.i1, lanes)
    if name == "load":
        fn = u.intrinsic(b.module, f"llvm.masked.load.v{lanes}i32.p0", ty,
                         [ty.as_pointer(), u.i32, mask_ty, ty])
        ptr, mask = args
        return b.call(fn, [ptr, u.const(4, u.i32), mask, ir.Constant(ty, [0] * lanes)])
    fn = u.intrinsic(b.module, f"llvm.masked.store.v{lanes}i32.p0", u.void,
                     [ty, ty.as_pointer(), u.i32, mask_ty])
    value, ptr, mask = args
    return b.call(fn, [value, ptr, u.const(4, u.i32), mask])


def _epilogue(b, k, dequant, accs, c, ldc, first, last, rows, cols, comp, rs, cs, bias):
    """Add the partial sums already in C (unless first), finish on the last block, store the
    valid rows and columns (C is handled as 32-bit words whatever its element type)."""
    lanes, nv = k.lanes, k.nv
    wty = u.vec(u.i32, lanes)
    fty = u.vec(u.f32, lanes)
    keep = u.splat(b, b.icmp_signed("==", first, u.const(0, u.i32)), lanes)
    is_last = b.icmp_signed("!=", last, u.const(0, u.i32))
    masks = [u.lane_mask(b, b.sub(cols, u.const(v * lanes)), lanes) for v in range(nv)]
    col_vecs = []
    for v in range(nv):
        mask = masks[v]
        row = {}
        if not k.acc_is_float:
            row["comp"] = _masked(b, "load", wty, [b.bitcast(u.gep(b, comp, v * lanes),
                                                             wty.as_pointer()), mask])
        if dequant:
            for key, ptr in (("cs", cs), ("bias", bias)):
                p = b.bitcast(u.gep(b, ptr, v * lanes), wty.as_pointer())
                row[key] = b.bitcast(_masked(b, "load", wty, [p, mask]), fty)
        col_vecs.append(row)
    for i in range(k.mr):
        with b.if_then(b.icmp_signed("<", u.const(i), rows)):
            crow = u.gep(b, c, b.mul(u.const(i), ldc))
            for v in range(nv):
                ptr = b.bitcast(u.gep(b, crow, v * lanes), wty.as_pointer())
                old = _masked(b, "load", wty, [ptr, b.and_(masks[v], keep)])
                acc = accs[i * nv + v]
                if k.acc_is_float:
                    total = b.bitcast(b.fadd(acc, b.bitcast(old, fty)), wty)
                else:
                    total = b.add(acc, old)
                    done = b.sub(total, col_vecs[v]["comp"])
                    if dequant:
                        r = u.splat(b, b.load(u.gep(b, rs, i), align=4), lanes)
                        f = b.sitofp(done, fty)
                        f = u.fma(b, b.fmul(f, r), col_vecs[v]["cs"], col_vecs[v]["bias"])
                        done = b.bitcast(f, wty)
                    total = b.select(is_last, done, total)
                _masked(b, "store", wty, [total, ptr, masks[v]])
    b.ret_void()


def _emit_worker(module: ir.Module, k: DotKernel, uk: ir.Function) -> ir.Function:
    """Thread `tid` of TM x TN: its rectangle of C, loops pc (KC) > ic (MC) > jr > ir."""
    w = emit_worker(module, "tf_dotgemm_worker", _W, _W, _W)
    b, a, bm, c = w.b, w.x, w.y, w.z
    m, n, kg, ldc = w[DParam.M], w[DParam.N], w[DParam.KG], w[DParam.LDC]
    mcb, kcb, tm, tn = w[DParam.MC], w[DParam.KC], w[DParam.TM], w[DParam.TN]
    comp = b.inttoptr(w[DParam.COMP], _W)
    rs, cs, bias = (b.inttoptr(w[s], _FP) for s in (DParam.ROW_SCALE, DParam.COL_SCALE,
                                                     DParam.BIAS))
    ti, tj = b.sdiv(w.tid, tn), b.srem(w.tid, tn)

    def split(extent, parts, index, unit):
        units = b.sdiv(b.add(extent, u.const(unit - 1)), u.const(unit))
        return u.smin(b, b.mul(b.sdiv(b.mul(units, index), parts), u.const(unit)), extent)

    m0, m1 = split(m, tm, ti, k.mr), split(m, tm, b.add(ti, u.const(1)), k.mr)
    n0, n1 = split(n, tn, tj, k.nr), split(n, tn, b.add(tj, u.const(1)), k.nr)
    with u.for_range(b, u.const(0), kg, kcb, "pc") as pc:
        kc = u.smin(b, kcb, b.sub(kg, pc))
        first = b.zext(b.icmp_signed("==", pc, u.const(0)), u.i32)
        last = b.zext(b.icmp_signed(">=", b.add(pc, kc), kg), u.i32)
        with u.for_range(b, m0, m1, mcb, "ic") as ic:
            m_end = u.smin(b, b.add(ic, mcb), m1)
            with u.for_range(b, n0, n1, k.nr, "jr") as jr:
                bpan = u.gep(b, bm, b.add(b.mul(b.sdiv(jr, u.const(k.nr)),
                                                b.mul(kg, u.const(k.nr))),
                                          b.mul(pc, u.const(k.nr))))
                cols = u.smin(b, u.const(k.nr), b.sub(n, jr))
                with u.for_range(b, ic, m_end, k.mr, "ir") as ir_:
                    apan = u.gep(b, a, b.add(b.mul(b.sdiv(ir_, u.const(k.mr)),
                                                   b.mul(kg, u.const(k.mr))),
                                             b.mul(pc, u.const(k.mr))))
                    rows = u.smin(b, u.const(k.mr), b.sub(m, ir_))
                    b.call(uk, [kc, apan, bpan, u.gep(b, c, b.add(b.mul(ir_, ldc), jr)), ldc,
                                first, last, rows, cols, u.gep(b, comp, jr), u.gep(b, rs, ir_),
                                u.gep(b, cs, jr), u.gep(b, bias, jr)])
    b.ret_void()
    return w.fn


def dotgemm_ir(k: DotKernel, target: Target, dequant: bool = False) -> str:
    """LLVM IR of the GEMM module for micro-kernel `k` (with the dequantizing epilogue)."""
    module = ir.Module(name=f"tf_dotgemm_{k.name}{'_dq' if dequant else ''}")
    module.triple = target.triple
    uk = _emit_microkernel(module, k, dequant)
    worker = _emit_worker(module, k, uk)
    emit_entry(module, worker, ENTRY, DParam)
    return str(module)
