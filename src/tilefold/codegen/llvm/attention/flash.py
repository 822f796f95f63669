"""LLVM IR of the fused attention kernel: flash-style, one pass over key/value blocks.

A task is (batch, head, block of QB query rows); tasks are split over the native pool. Per key
block of KB keys (`AttentionConfig.tile`: 4 vectors with 32 vector registers, 2 with 16):

    Kt = K[block]^T                        packed once per task and block (QB rows reuse it)
    for ROWS query rows at a time:         register tile ROWS x KB scores
        s = (q · Kt) * scale, masked       bool mask, additive mask, causal, key tail -> -inf
        m' = max(m, max s); a = exp(m - m'); p = exp(s - m'); l = l * a + sum p
        O = O * a + p · V[block]           register tiles of ROWS x (up to ACCS / ROWS) vectors
    out = O / l                            rows with every key masked give zeros (as PyTorch)
    lse = m + log(l)                       with `AttentionConfig.lse` (a training forward's)

Vectors run along keys (scores) and along Ev (outputs), so the only horizontal reductions are
one max and one sum per row and key block. A block the mask excludes for every row of the task
(False, or -inf: a static cache's positions past the prompt) is skipped before K is packed.
Dims and strides are read from the array objects at run time: one compiled kernel serves every
batch size, sequence length and layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.attention.entry import (
    HK,
    K_STRIDES,
    LSE,
    LSE_STRIDES,
    M_STRIDES,
    O_STRIDES,
    Q_STRIDES,
    SCALE,
    SLOTS,
    V_STRIDES,
    B,
    H,
    L,
    S,
    begin_worker,
    emit_entry,
)
from tilefold.codegen.llvm.attention.liveness import block_live_fn, masked_load
from tilefold.codegen.llvm.vecmath.builder import MathBuilder
from tilefold.codegen.llvm.vecmath.exp_log import exp_nonpositive, log

QB = 128  # query rows per task
# (ROWS query rows, KB key vectors, ACCS accumulators) per register tile, by the vector
# registers the ISA has: the tile's accumulators, one row of Kt or V and a broadcast must fit
# (with 16 registers, 4 x 4 spilled: 6 x 2 is AVX2 GEMM's 6x16 shape).
TILES = {32: (4, 4, 16), 16: (6, 2, 12)}
FP = u.f32.as_pointer()
NEG_INF = -math.inf



@dataclass(frozen=True)
class AttentionConfig:
    """What a compiled kernel is specialized for (everything else is read at run time)."""

    e: int  # q/k feature dim
    ev: int  # v feature dim
    mask: str  # "none", "bool" or "float"
    causal: bool
    lanes: int  # f32 lanes per vector
    threads: int
    registers: int = 32  # vector registers of the ISA
    lse: bool = False  # also write each query row's log-sum-exp of its scaled, masked scores

    @property
    def tile(self) -> tuple[int, int, int]:
        """(query rows, key vectors, accumulators) of a register tile."""
        return TILES[32 if self.registers >= 32 else 16]

    @property
    def rows(self) -> int:
        return self.tile[0]

    @property
    def kb(self) -> int:
        return self.tile[1] * self.lanes

    @property
    def evv(self) -> int:
        return -(-self.ev // self.lanes)


def attention_ir(cfg: AttentionConfig, name: str, triple: str, features: frozenset[str]) -> str:
    """The module holding `name(q, k, v, [mask], out, [lse], float scale)` on rank-4 array
    objects."""
    module = ir.Module(name=name)
    module.triple = triple
    worker = _Worker(module, cfg, f"{name}_worker", features).emit()
    emit_entry(module, name, cfg.mask, cfg.threads, worker, lse=cfg.lse)
    return str(module)


def hreduce(b: ir.IRBuilder, v: ir.Value, op) -> ir.Value:
    """Horizontal reduction of a vector by halving (log2(lanes) shuffles and ops)."""
    width = v.type.count
    while width > 1:
        width //= 2
        lo = b.shuffle_vector(v, v, ir.Constant(u.vec(u.i32, width), list(range(width))))
        hi = b.shuffle_vector(v, v, ir.Constant(u.vec(u.i32, width),
                                                list(range(width, 2 * width))))
        v = op(lo, hi)
    return b.extract_element(v, u.const(0, u.i32))


class _Worker:
    """Emits `worker(ctx, tid, nthreads)`: this thread's share of the (b, h, query block) tasks."""

    def __init__(self, module: ir.Module, cfg: AttentionConfig, name: str,
                 features: frozenset[str]):
        self.module, self.cfg, self.name, self.features = module, cfg, name, features
        self.vty = u.vec(u.f32, cfg.lanes)
        self.evp = cfg.evv * cfg.lanes

    def emit(self) -> ir.Function:
        cfg = self.cfg
        self.live = None
        if cfg.mask != "none":
            self.live = block_live_fn(self.module, f"{self.name}_live", cfg.mask, cfg.causal,
                                      cfg.lanes, cfg.kb)
        fn, b, self.slot = begin_worker(self.module, self.name, SLOTS)
        self.b = b
        _, tid, nth = fn.args
        self.kt = u.float_buffer(b, cfg.e * cfg.kb, "kt")
        self.obuf = u.float_buffer(b, QB * self.evp, "obuf")
        self.pbuf = u.float_buffer(b, cfg.rows * cfg.kb, "pbuf")
        self.mrow = u.float_buffer(b, QB, "mrow")
        self.lrow = u.float_buffer(b, QB, "lrow")
        self.scale = b.bitcast(b.trunc(self.slot[SCALE], u.i32), u.f32)
        s = self.slot
        nqb = b.sdiv(b.add(s[L], u.const(QB - 1)), u.const(QB))
        tasks = b.mul(b.mul(s[B], s[H]), nqb)
        t, n = b.sext(tid, u.i64), b.sext(nth, u.i64)
        t0 = b.sdiv(b.mul(tasks, t), n)
        t1 = b.sdiv(b.mul(tasks, b.add(t, u.const(1))), n)
        with u.for_range(b, t0, t1, name="task") as task:
            bh = b.sdiv(task, nqb)
            self._task(b.sdiv(bh, s[H]), b.srem(bh, s[H]), b.mul(b.srem(task, nqb),
                                                                 u.const(QB)))
        b.ret_void()
        return fn

    def _ptr(self, slot: int, ty: ir.Type) -> ir.Value:
        return self.b.inttoptr(self.slot[slot], ty.as_pointer())

    def _offset(self, base: int, *index: ir.Value) -> ir.Value:
        b, total = self.b, u.const(0)
        for i, x in enumerate(index):
            total = b.add(total, b.mul(x, self.slot[base + i]))
        return total

    def _task(self, bi: ir.Value, h: ir.Value, i0: ir.Value) -> None:
        b, cfg, s = self.b, self.cfg, self.slot
        hk = b.sdiv(b.mul(h, s[HK]), s[H])  # grouped-query heads share key/value heads
        self.i0 = i0
        self.nrows = u.smin(b, u.const(QB), b.sub(s[L], i0))
        self.q = u.gep(b, self._ptr(0, u.f32), self._offset(Q_STRIDES, bi, h, i0))
        self.k = u.gep(b, self._ptr(1, u.f32), self._offset(K_STRIDES, bi, hk))
        self.v = u.gep(b, self._ptr(2, u.f32), self._offset(V_STRIDES, bi, hk))
        if cfg.mask != "none":
            mty = u.i8 if cfg.mask == "bool" else u.f32
            self.m = u.gep(b, self._ptr(3, mty), self._offset(M_STRIDES, bi, h, i0))
        out = u.gep(b, self._ptr(4, u.f32), self._offset(O_STRIDES, bi, h, i0))
        if cfg.lse:
            self.lse = u.gep(b, self._ptr(LSE, u.f32), self._offset(LSE_STRIDES, bi, h, i0))
        zero = ir.Constant(self.vty, [0.0] * cfg.lanes)
        with u.for_range(b, u.const(0), b.mul(self.nrows, u.const(cfg.evv)), name="zo") as i:
            b.store(zero, u.vptr(b, u.gep(b, self.obuf, b.mul(i, u.const(cfg.lanes))),
                                 cfg.lanes), align=64)
        with u.for_range(b, u.const(0), self.nrows, name="zr") as r:
            b.store(ir.Constant(u.f32, NEG_INF), u.gep(b, self.mrow, r))
            b.store(ir.Constant(u.f32, 0.0), u.gep(b, self.lrow, r))
        kend = s[S]
        if cfg.causal:  # key j <= query i (top-left aligned)
            kend = u.smin(b, kend, b.add(i0, self.nrows))
        with u.for_range(b, u.const(0), kend, cfg.kb, name="kblock") as j0:
            self.j0 = j0
            self.kn = u.smin(b, u.const(cfg.kb), b.sub(kend, j0))
            if self.live is None:
                self._block()
            else:  # a block the mask excludes for every row is never read
                with b.if_then(self._block_live()):
                    self._block()
        self._store(out)
        if cfg.lse:
            self._store_lse()

    def _block(self) -> None:
        b, cfg = self.b, self.cfg
        self._pack_keys()
        full = b.sub(self.nrows, b.srem(self.nrows, u.const(cfg.rows)))
        with u.for_range(b, u.const(0), full, cfg.rows, name="rows") as r0:
            self._rows(r0, cfg.rows)
        with u.for_range(b, full, self.nrows, name="row") as r0:
            self._rows(r0, 1)

    def _block_live(self) -> ir.Value:
        """Whether any of the task's rows keeps a key of the block (rows sharing one mask row,
        stride 0, are asked once: the last of them, which the causal flag lets see most)."""
        b = self.b
        smi = self.slot[M_STRIDES + 2]
        shared = b.icmp_signed("==", smi, u.const(0))
        rows = b.select(shared, u.const(1), self.nrows)
        first = b.select(shared, b.add(self.i0, b.sub(self.nrows, u.const(1))), self.i0)
        return b.call(self.live, [self.m, u.const(1), u.const(0), rows, smi, first, self.j0,
                                  self.kn])

    def _pack_keys(self) -> None:
        """Kt[d, jj] = K[j0 + jj, d], zeros past the last key."""
        b, cfg = self.b, self.cfg
        zero = ir.Constant(self.vty, [0.0] * cfg.lanes)
        for i in range(cfg.e * cfg.kb // cfg.lanes):
            b.store(zero, u.vptr(b, u.gep(b, self.kt, i * cfg.lanes), cfg.lanes), align=64)
        sj, sd = self.slot[K_STRIDES + 2], self.slot[K_STRIDES + 3]
        with u.for_range(b, u.const(0), self.kn, name="pk") as jj:
            row = u.gep(b, self.k, b.mul(b.add(self.j0, jj), sj))
            with u.for_range(b, u.const(0), u.const(cfg.e), name="pd") as d:
                value = b.load(u.gep(b, row, b.mul(d, sd)))
                b.store(value, u.gep(b, self.kt, b.add(b.mul(d, u.const(cfg.kb)), jj)))

    def _rows(self, r0: ir.Value, rows: int) -> None:
        scores = self._scores(r0, rows)
        alphas = [self._softmax_step(r0, r, scores[r]) for r in range(rows)]
        self._pv(r0, rows, alphas)

    def _scores(self, r0: ir.Value, rows: int) -> list[list[ir.Value]]:
        """s[r][v] = scale * q[r0 + r] · Kt[:, v-th vector], masked to -inf."""
        b, cfg = self.b, self.cfg
        kv = cfg.kb // cfg.lanes
        zero = ir.Constant(self.vty, [0.0] * cfg.lanes)
        sqi, sqd = self.slot[Q_STRIDES + 2], self.slot[Q_STRIDES + 3]
        qrows = [u.gep(b, self.q, b.mul(b.add(r0, u.const(r)), sqi)) for r in range(rows)]
        with u.for_range_carry(b, u.const(0), u.const(cfg.e), 1, [zero] * (rows * kv),
                               name="dot") as loop:
            d = loop.index
            kts = [b.load(u.vptr(b, u.gep(b, self.kt, b.add(b.mul(d, u.const(cfg.kb)),
                                                             u.const(v * cfg.lanes))),
                                 cfg.lanes), align=64) for v in range(kv)]
            nxt = []
            for r in range(rows):
                qs = u.splat(b, b.load(u.gep(b, qrows[r], b.mul(d, sqd))), cfg.lanes)
                nxt += [u.fma(b, qs, kts[v], loop.values[r * kv + v]) for v in range(kv)]
            loop.next = nxt
        accs = loop.result
        return [[self._mask(r0, r, v, accs[r * kv + v]) for v in range(kv)] for r in range(rows)]

    def _mask(self, r0: ir.Value, r: int, v: int, acc: ir.Value) -> ir.Value:
        b, cfg = self.b, self.cfg
        lanes = cfg.lanes
        iota = ir.Constant(u.vec(u.i64, lanes), list(range(v * lanes, (v + 1) * lanes)))
        jj = iota
        keep = b.icmp_signed("<", jj, u.splat(b, self.kn, lanes))
        x = b.fmul(acc, u.splat(b, self.scale, lanes))
        row = b.add(r0, u.const(r))
        if cfg.causal:
            i = b.add(self.i0, row)
            keep = b.and_(keep, b.icmp_signed("<=", b.add(jj, u.splat(b, self.j0, lanes)),
                                              u.splat(b, i, lanes)))
        if cfg.mask != "none":
            mty = u.i8 if cfg.mask == "bool" else u.f32
            ptr = u.gep(b, self.m, b.add(b.mul(row, self.slot[M_STRIDES + 2]),
                                         b.add(self.j0, u.const(v * lanes))))
            m = masked_load(b, ptr, u.vec(mty, lanes), keep)
            if cfg.mask == "bool":
                keep = b.and_(keep, b.icmp_unsigned("!=", m, ir.Constant(m.type, [0] * lanes)))
            else:
                x = b.fadd(x, m)
        return b.select(keep, x, ir.Constant(self.vty, [NEG_INF] * lanes))

    def _softmax_step(self, r0: ir.Value, r: int, s: list[ir.Value]) -> ir.Value:
        """Online softmax for one row: updates m and l, leaves p in pbuf, returns exp(m - m')."""
        b, cfg = self.b, self.cfg
        row = b.add(r0, u.const(r))

        def vmax(x, y):
            return b.select(b.fcmp_ordered(">", x, y), x, y)

        top = s[0]
        for x in s[1:]:
            top = vmax(top, x)
        m_old = b.load(u.gep(b, self.mrow, row))
        m_new = vmax(m_old, hreduce(b, top, vmax))
        m_safe = b.select(b.fcmp_ordered("==", m_new, ir.Constant(u.f32, NEG_INF)),
                          ir.Constant(u.f32, 0.0), m_new)
        alpha = self._exp(b.fsub(m_old, m_safe))
        msplat = u.splat(b, m_safe, cfg.lanes)
        total = None
        for v, x in enumerate(s):
            p = self._exp(b.fsub(x, msplat))
            b.store(p, u.vptr(b, u.gep(b, self.pbuf, r * cfg.kb + v * cfg.lanes), cfg.lanes),
                    align=64)
            total = p if total is None else b.fadd(total, p)
        lsum = hreduce(b, total, b.fadd)
        lptr = u.gep(b, self.lrow, row)
        b.store(b.fadd(b.fmul(b.load(lptr), alpha), lsum), lptr)
        b.store(m_new, u.gep(b, self.mrow, row))
        return alpha

    def _exp(self, x: ir.Value) -> ir.Value:
        """exp(x) for x <= 0 (0 for masked keys' -inf), never touching subnormals."""
        return exp_nonpositive(MathBuilder(self.b, x.type, self.features), x)

    def _vmask(self, c: int) -> ir.Value | None:
        cfg = self.cfg
        rest = cfg.ev - c * cfg.lanes
        if rest >= cfg.lanes:
            return None
        return ir.Constant(u.vec(u.i1, cfg.lanes), [i < rest for i in range(cfg.lanes)])

    def _pv(self, r0: ir.Value, rows: int, alphas: list[ir.Value]) -> None:
        """O[r0:r0+rows] = O * alpha + P · V[j0:j0+kn], in register tiles of Ev vectors."""
        b, cfg = self.b, self.cfg
        lanes = cfg.lanes
        chunk = max(1, cfg.tile[2] // rows)
        svj = self.slot[V_STRIDES + 2]
        for c0 in range(0, cfg.evv, chunk):
            cs = range(c0, min(cfg.evv, c0 + chunk))
            optrs, inits = [], []
            for r in range(rows):
                base = b.mul(b.add(r0, u.const(r)), u.const(self.evp))
                a = u.splat(b, alphas[r], lanes)
                for c in cs:
                    p = u.vptr(b, u.gep(b, self.obuf, b.add(base, u.const(c * lanes))), lanes)
                    optrs.append(p)
                    inits.append(b.fmul(b.load(p, align=64), a))
            with u.for_range_carry(b, u.const(0), self.kn, 1, inits, name="pv") as loop:
                jj = loop.index
                vrow = u.gep(b, self.v, b.mul(b.add(self.j0, jj), svj))
                vv = []
                for c in cs:
                    ptr = u.gep(b, vrow, c * lanes)
                    mask = self._vmask(c)
                    vv.append(b.load(u.vptr(b, ptr, lanes), align=4) if mask is None
                              else u.masked_load(b, u.vptr(b, ptr, lanes), mask, lanes))
                nxt = []
                for r in range(rows):
                    prob = b.load(u.gep(b, self.pbuf, b.add(jj, u.const(r * cfg.kb))))
                    p = u.splat(b, prob, lanes)
                    for x in vv:
                        nxt.append(u.fma(b, p, x, loop.values[len(nxt)]))
                loop.next = nxt
            for p, value in zip(optrs, loop.result, strict=True):
                b.store(value, p, align=64)

    def _store(self, out: ir.Value) -> None:
        """out[i0 + r] = O[r] / l[r] (zeros where every key was masked)."""
        b, cfg = self.b, self.cfg
        lanes = cfg.lanes
        soi = self.slot[O_STRIDES + 2]
        with u.for_range(b, u.const(0), self.nrows, name="st") as r:
            total = b.load(u.gep(b, self.lrow, r))
            inv = b.select(b.fcmp_ordered(">", total, ir.Constant(u.f32, 0.0)),
                           b.fdiv(ir.Constant(u.f32, 1.0), total), ir.Constant(u.f32, 0.0))
            inv = u.splat(b, inv, lanes)
            orow = u.gep(b, out, b.mul(r, soi))
            for c in range(cfg.evv):
                src = u.vptr(b, u.gep(b, self.obuf, b.add(b.mul(r, u.const(self.evp)),
                                                          u.const(c * lanes))), lanes)
                value = b.fmul(b.load(src, align=64), inv)
                dst = u.vptr(b, u.gep(b, orow, c * lanes), lanes)
                mask = self._vmask(c)
                if mask is None:
                    b.store(value, dst, align=4)
                else:
                    u.masked_store(b, value, dst, mask)

    def _store_lse(self) -> None:
        """lse[i0 + r] = m[r] + log(l[r]), a vector of rows at a time (-inf where every key
        was masked: m is -inf and l is 0)."""
        b, cfg = self.b, self.cfg
        lanes = cfg.lanes
        math = MathBuilder(b, self.vty, self.features)
        stride = self.slot[LSE_STRIDES + 2]
        with u.for_range(b, u.const(0), self.nrows, lanes, name="lse") as r0:
            top = b.load(u.vptr(b, u.gep(b, self.mrow, r0), lanes), align=4)
            total = b.load(u.vptr(b, u.gep(b, self.lrow, r0), lanes), align=4)
            kept = b.fcmp_ordered(">", total, ir.Constant(self.vty, [0.0] * lanes))
            value = b.select(kept, b.fadd(top, log(math, total)),
                             ir.Constant(self.vty, [NEG_INF] * lanes))
            for i in range(lanes):
                row = b.add(r0, u.const(i))
                with b.if_then(b.icmp_signed("<", row, self.nrows)):
                    b.store(b.extract_element(value, u.const(i, u.i32)),
                            u.gep(b, self.lse, b.mul(row, stride)))
