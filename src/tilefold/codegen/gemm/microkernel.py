"""The register-tile micro-kernel generator: C[mr, nv*VL] (+)= A_panel @ B_panel over kc steps.

One generator serves every ISA: the ISA-specific parts are the vector width, how an element of A
reaches all lanes (a broadcast load on x86, `fmla` by element on NEON) and the tile shape, all
chosen by the registry entry. A comes packed (`mr` floats per k) or, for `a_direct` variants, in
place (row i at `a + i * lda`, contiguous along k).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from tilefold.codegen import llvm_util as u

# Signature shared by every variant, so the driver can call any of them through one table.
UKERNEL_TYPE = ir.FunctionType(
    u.void, [u.i64, u.f32.as_pointer(), u.i64, u.f32.as_pointer(), u.i64, u.f32.as_pointer(),
             u.i64, u.i32, u.i64])
UKERNEL_ARGS = ("kc", "a", "lda", "b", "ldb", "c", "ldc", "beta", "ncols")


@dataclass(frozen=True)
class TileSpec:
    """One variant: `mr` rows by `nv` vectors of `lanes` floats.

    `a_lanes` > 1 selects NEON-style A access (load `a_lanes` elements, use them by lane);
    `a_direct` reads A in place (`lda` floats between rows) instead of from a packed panel.
    `nv_dynamic` serves every width up to `nv` vectors (masked B loads and C stores), one
    function instead of `nv`: for row tails, which carry too little work to earn a variant each.
    `b_prefetch` > 0 prefetches the B row that many k steps ahead (B streaming from L2).
    """

    mr: int
    nv: int
    lanes: int
    unroll: int = 4
    a_lanes: int = 1
    a_direct: bool = False
    nv_dynamic: bool = False
    b_prefetch: int = 0

    def __post_init__(self):
        if self.a_direct and self.a_lanes > 1:
            raise ValueError("a_direct reads A by broadcast; lane-indexed A needs packed panels")

    @property
    def name(self) -> str:
        flags = ("v" if self.nv_dynamic else "") + ("d" if self.a_direct else "")
        return f"tf_uk_{self.mr}x{self.nv}x{self.lanes}{flags}"


def emit_microkernel(module: ir.Module, spec: TileSpec) -> ir.Function:
    """Add the variant `spec` to `module`; B holds `ldb` floats per k, A `mr` (packed) or 1;
    the tile is `ncols` columns wide (the last vector partial, or with `nv_dynamic` fewer)."""
    fn = ir.Function(module, UKERNEL_TYPE, name=spec.name)
    fn.linkage = "internal"
    for arg, name in zip(fn.args, UKERNEL_ARGS, strict=True):
        arg.name = name
    kc, a, lda, b_ptr, ldb, c, ldc, beta, ncols = fn.args
    for p in (a, b_ptr, c):
        p.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vl, vty = spec.lanes, u.vec(u.f32, spec.lanes)
    for i in range(spec.mr):
        u.prefetch(b, u.gep(b, c, b.mul(u.const(i), ldc)), write=True)
    zero = u.zeros(vty)
    accs = [[zero] * spec.nv for _ in range(spec.mr)]
    if spec.a_direct:
        rows, a_step = [b.mul(u.const(i), lda) for i in range(spec.mr)], 1
    else:
        rows, a_step = [u.const(i) for i in range(spec.mr)], spec.mr

    masks = [u.lane_mask(b, b.sub(ncols, u.const(v * vl)), vl) for v in range(spec.nv)]

    def load_b(bp, v):
        ptr = u.vptr(b, u.gep(b, bp, v * vl), vl)
        if spec.nv_dynamic and v > 0:
            return u.masked_load(b, ptr, masks[v], vl)
        return b.load(ptr, align=4)

    b_ahead = b.mul(u.const(spec.b_prefetch), ldb)

    def step(accs, ap, bp):
        """One k step: nv loads of B, mr broadcasts of A, mr*nv FMAs."""
        bv = [load_b(bp, v) for v in range(spec.nv)]
        for v in range(spec.nv if spec.b_prefetch else 0):
            u.prefetch(b, u.gep(b, bp, b.add(b_ahead, u.const(v * vl))))
        out = []
        for i in range(spec.mr):
            if spec.a_lanes > 1:
                base = i - i % spec.a_lanes
                if i % spec.a_lanes == 0:
                    n = min(spec.a_lanes, spec.mr - base)
                    chunk = b.load(u.vptr(b, u.gep(b, ap, base), n), align=4)
                av = u.lane_splat(b, chunk, i % spec.a_lanes)
                if n != vl:
                    av = b.shuffle_vector(av, ir.Constant(av.type, None),
                                          ir.Constant(u.vec(u.i32, vl), [0] * vl))
            else:
                av = u.splat(b, b.load(u.gep(b, ap, rows[i]), align=4), vl)
            out.append([u.fma(b, av, bv[v], accs[i][v]) for v in range(spec.nv)])
        return out, u.gep(b, ap, a_step), b.gep(bp, [ldb], inbounds=True)

    def prefetch_next(k):
        """Direct A: stream in the next tile down (mr rows on) while this one computes, the
        lines this step's k range covers in a packed order; exact when its rows are adjacent
        (lda = kc), merely early or wasted otherwise (prefetches never fault)."""
        for line in range(-(-spec.mr * spec.unroll * 4 // 64)):
            u.prefetch(b, u.gep(b, next_tile, b.add(b.mul(k, u.const(spec.mr)),
                                                    u.const(line * 16))), locality=2)

    next_tile = u.gep(b, a, b.mul(u.const(spec.mr), lda))
    hook = prefetch_next if spec.a_direct else None
    accs = _k_loop(b, kc, spec, accs, a, b_ptr, step, hook)
    _epilogue(b, spec, accs, c, ldc, beta, masks)
    return fn


def _k_loop(b, kc, spec, accs, a, bp, step, hook=None):
    """Unrolled main loop plus a remainder loop (none when rolled), accumulators carried in phis
    (registers)."""
    flat = [x for row in accs for x in row]
    n_main = b.mul(b.sdiv(kc, u.const(spec.unroll)), u.const(spec.unroll))
    loops = [("main", n_main, spec.unroll), ("rest", kc, 1)]
    for label, stop, unroll in loops[:1] if spec.unroll == 1 else loops:
        pre = b.block
        head = b.append_basic_block(f"{label}.head")
        body = b.append_basic_block(f"{label}.body")
        done = b.append_basic_block(f"{label}.done")
        start_k = u.const(0) if label == "main" else n_main
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(u.i64, "k")
        pa = b.phi(a.type, "pa")
        pb = b.phi(bp.type, "pb")
        phis = [b.phi(x.type) for x in flat]
        for phi, init in zip(phis, flat, strict=True):
            phi.add_incoming(init, pre)
        k.add_incoming(start_k, pre)
        pa.add_incoming(a, pre)
        pb.add_incoming(bp, pre)
        b.cbranch(b.icmp_signed("<", k, stop), body, done)
        b.position_at_end(body)
        cur = [phis[i * spec.nv:(i + 1) * spec.nv] for i in range(spec.mr)]
        ca, cb = pa, pb
        if hook is not None and label == "main":
            hook(k)
        for _ in range(unroll):
            cur, ca, cb = step(cur, ca, cb)
        new = [x for row in cur for x in row]
        for phi, val in zip(phis, new, strict=True):
            phi.add_incoming(val, b.block)
        k.add_incoming(b.add(k, u.const(unroll)), b.block)
        pa.add_incoming(ca, b.block)
        pb.add_incoming(cb, b.block)
        b.branch(head)
        b.position_at_end(done)
        flat, a, bp = list(phis), pa, pb
    return [flat[i * spec.nv:(i + 1) * spec.nv] for i in range(spec.mr)]


def _epilogue(b, spec, accs, c, ldc, beta, masks):
    """Write the tile. C is read through a mask that is empty when beta=0 (so garbage in C never
    leaks), and columns past `ncols` are neither read nor written: `masks[v]` guards vector v
    where it may be partial (the last one; any with `nv_dynamic`)."""
    vl = spec.lanes
    keep = u.splat(b, b.icmp_signed("!=", beta, u.const(0, u.i32)), vl)
    for i in range(spec.mr):
        row = u.gep(b, c, b.mul(u.const(i), ldc))
        for v in range(spec.nv):
            ptr = u.vptr(b, u.gep(b, row, v * vl), vl)
            partial = spec.nv_dynamic or v == spec.nv - 1
            old = u.masked_load(b, ptr, b.and_(masks[v], keep) if partial else keep, vl)
            val = b.fadd(accs[i][v], old)
            if partial:
                u.masked_store(b, val, ptr, masks[v])
            else:
                b.store(val, ptr, align=4)
    b.ret_void()
