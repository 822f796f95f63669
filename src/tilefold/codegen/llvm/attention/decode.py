"""LLVM IR of the decode attention kernel: a few query rows against a long key/value cache.

Flash-decoding on the CPU. A *group* is one (batch, key/value head); its R = H/Hk * Lq rows
(every query head sharing the key/value head, every query row) are computed together, row
after row on each key block, so each K and V row comes from memory once per group and from L1
for the group's other rows. Scores are dot products along E on K's rows as they lie (no
transpose): the partial-sum vectors of `lanes` keys fold into one vector of their scores by a
butterfly of two-source shuffles (`_fold`); the online softmax and O = O a + p V then run as in
flash.py, with q scaled once into a per-thread copy.

Work follows the keys a group can see, not the cache's length: the causal flag and a scan of
the mask from both ends bound each group's live key blocks (a static cache's mask is False
past the current position), and a block inside them whose mask excludes every key of every row
(False, or -inf) is skipped without reading K or V. The live blocks of all groups, in order,
are split evenly over the threads. A thread covering a whole group writes its rows; a group
split between threads leaves (max, sum, O) per row in a slot of each thread that worked on it,
and after a barrier the thread holding its first block combines them (a thread heads at most
one split group: the last it touches). Rows that see no key give zeros, as PyTorch does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.attention.entry import (
    HK,
    K_STRIDES,
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
    emit_entry,
)
from tilefold.codegen.llvm.attention.flash import hreduce
from tilefold.codegen.llvm.attention.liveness import block_live_fn, masked_load
from tilefold.codegen.llvm.gemm.abi import WORKER_TYPE
from tilefold.codegen.llvm.vecmath.builder import MathBuilder
from tilefold.codegen.llvm.vecmath.exp_log import exp_nonpositive

# Bytes of a key block's K (or V) rows: it stays in L1 while each row of the group reads it.
BLOCK_BYTES = 16384
NEG_INF = -math.inf
FP = u.f32.as_pointer()
I64P = u.i64.as_pointer()


@dataclass(frozen=True)
class DecodeConfig:
    """What a compiled decode kernel is specialized for (everything else is read at run time)."""

    e: int  # q/k feature dim
    ev: int  # v feature dim
    mask: str  # "none", "bool" or "float"
    causal: bool
    lanes: int  # f32 lanes per vector
    threads: int
    registers: int = 32  # vector registers of the ISA

    @property
    def kb(self) -> int:
        """Keys per block: the unit of skipping masked keys and of splitting over threads, up
        to 64 and `BLOCK_BYTES` of K or V, a multiple of the lanes."""
        fit = BLOCK_BYTES // (4 * max(self.e, self.ev, 1)) // self.lanes * self.lanes
        return max(self.lanes, min(64, fit))

    @property
    def pv_tile(self) -> tuple[int, int]:
        """(rows, vectors of a row) of P V's register tile: rows x vectors accumulators, one row
        of V and a broadcast p within the registers, up to 4 rows; Ev in as few passes as let
        two rows share each V load."""
        budget = self.registers - 2
        passes = 1
        while True:
            cols = -(-self.evv // passes)
            rows = min(4, (budget - cols) // max(cols, 1))
            if rows >= 2 or cols <= 1:
                return max(rows, 1), max(cols, 1)
            passes += 1

    @property
    def ec(self) -> int:
        """Vectors per q/k row."""
        return -(-self.e // self.lanes)

    @property
    def evv(self) -> int:
        """Vectors per v/out row."""
        return -(-self.ev // self.lanes)


def decode_ir(cfg: DecodeConfig, name: str, triple: str, features: frozenset[str]) -> str:
    """The module holding `name(q, k, v, [mask], out, float scale)` on rank-4 array objects."""
    module = ir.Module(name=name)
    module.triple = triple
    worker = _Worker(module, cfg, name, features).emit()
    emit_entry(module, name, cfg.mask, cfg.threads, worker, extra=cfg.threads)
    return str(module)


def _fold_indices(lanes: int, width: int) -> tuple[list[int], list[int]]:
    """Shuffle indices over (x, y) whose sum halves each key's `width` lanes: x's keys first,
    then y's, each now `width / 2` lanes wide (the first and second halves of the old ones)."""
    half, keys = width // 2, lanes // width
    lo = []
    for lane in range(lanes):
        chunk, within = divmod(lane, half)
        source = 0 if chunk < keys else lanes
        lo.append(source + (chunk % keys) * width + within)
    return lo, [i + half for i in lo]


class _Fn:
    """An internal function under construction, with the entry's slots loaded at its top."""

    def __init__(self, module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]):
        self.fn = ir.Function(module, ir.FunctionType(ret, [I64P, *args]), name=name)
        self.fn.linkage = "internal"
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.args = self.fn.args[1:]
        self.s = [self.b.load(u.gep(self.b, self.fn.args[0], i), name=f"s{i}")
                  for i in range(SLOTS)]

    def ptr(self, slot: int, ty: ir.Type = u.f32) -> ir.Value:
        return self.b.inttoptr(self.s[slot], ty.as_pointer())

    def offset(self, base: int, *index: ir.Value) -> ir.Value:
        b, total = self.b, u.const(0)
        for i, x in enumerate(index):
            if x is not None:
                total = b.add(total, b.mul(x, self.s[base + i]))
        return total

    def group(self) -> ir.Value:
        """Query heads per key/value head."""
        return self.b.sdiv(self.s[H], self.s[HK])


class _Worker:
    """Emits the worker and the functions it calls."""

    def __init__(self, module: ir.Module, cfg: DecodeConfig, name: str,
                 features: frozenset[str]):
        self.module, self.cfg, self.name, self.features = module, cfg, name, features
        self.lanes = cfg.lanes
        self.vty = u.vec(u.f32, cfg.lanes)
        self.ep, self.evp = cfg.ec * cfg.lanes, cfg.evv * cfg.lanes
        self.part = None  # floats per row of a partial slot: m, l, then O

    # -- small helpers ---------------------------------------------------------------------

    def _kend(self, f: _Fn) -> ir.Value:
        if self.cfg.causal:  # top-left aligned: row i sees keys j <= i, so j < Lq at most
            return u.smin(f.b, f.s[S], f.s[L])
        return f.s[S]

    def _iota(self, start: int, count: int) -> ir.Constant:
        return ir.Constant(u.vec(u.i64, count), list(range(start, start + count)))

    def _tail_mask(self, c: int, count: int) -> ir.Value | None:
        """Lanes of vector `c` of a row of `count` floats that lie inside it (None: all)."""
        rest = count - c * self.lanes
        if rest >= self.lanes:
            return None
        return ir.Constant(u.vec(u.i1, self.lanes), [i < rest for i in range(self.lanes)])

    def _exp(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        return exp_nonpositive(MathBuilder(b, x.type, self.features), x)

    @staticmethod
    def _vmax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
        return b.select(b.fcmp_ordered(">", x, y), x, y)

    def _row_ptr(self, f: _Fn, slot: int, strides: int, bi, h, i, ty=u.f32) -> ir.Value:
        return u.gep(f.b, f.ptr(slot, ty), f.offset(strides, bi, h, i))

    # -- the mask's live blocks ------------------------------------------------------------

    def _live(self, f: _Fn, live: ir.Function, bi, hk, j0, kn) -> ir.Value:
        """Whether any row of group (bi, hk) keeps a key of [j0, j0 + kn). Rows sharing a mask
        row (stride 0) are asked once; with the causal flag the last of them sees the most."""
        b = f.b
        g = f.group()
        smh, smi = f.s[M_STRIDES + 1], f.s[M_STRIDES + 2]
        heads = b.select(b.icmp_signed("==", smh, u.const(0)), u.const(1), g)
        shared = b.icmp_signed("==", smi, u.const(0))
        rows = b.select(shared, u.const(1), f.s[L])
        first = b.select(shared, b.sub(f.s[L], u.const(1)), u.const(0))
        base = u.gep(b, f.ptr(3, u.i8 if self.cfg.mask == "bool" else u.f32),
                     f.offset(M_STRIDES, bi, b.mul(hk, g)))
        return b.call(live, [base, heads, smh, rows, smi, first, j0, kn])

    def _bounds_fn(self, live: ir.Function | None) -> ir.Function:
        """bounds(g, memo): memo = (group, first live block, end of live blocks) for group g.
        A mask that is the same for every group (batch and head strides 0) is scanned once."""
        cfg = self.cfg
        f = _Fn(self.module, f"{self.name}_bounds", u.void, [u.i64, I64P])
        b, (g, memo) = f.b, f.args
        blocks = b.sdiv(b.add(self._kend(f), u.const(cfg.kb - 1)), u.const(cfg.kb))
        if live is None:
            b.store(u.const(0), u.gep(b, memo, 1))
            b.store(blocks, u.gep(b, memo, 2))
            b.ret_void()
            return f.fn
        same = b.and_(b.icmp_signed("==", f.s[M_STRIDES], u.const(0)),
                      b.icmp_signed("==", f.s[M_STRIDES + 1], u.const(0)))
        gb = b.select(same, u.const(0), g)
        with b.if_then(b.icmp_signed("!=", b.load(memo), gb)):
            bi, hk = b.sdiv(gb, f.s[HK]), b.srem(gb, f.s[HK])
            kend = self._kend(f)

            def dead(block: ir.Value) -> ir.Value:
                j0 = b.mul(block, u.const(cfg.kb))
                kn = u.smin(b, u.const(cfg.kb), b.sub(kend, j0))
                return b.not_(self._live(f, live, bi, hk, j0, kn))

            hi = self._while(b, blocks, lambda x: b.icmp_signed(">", x, u.const(0)),
                             lambda x: dead(b.sub(x, u.const(1))), lambda x: b.sub(x, u.const(1)))
            lo = self._while(b, u.const(0), lambda x: b.icmp_signed("<", x, hi), dead,
                             lambda x: b.add(x, u.const(1)))
            for i, x in enumerate((gb, lo, hi)):
                b.store(x, u.gep(b, memo, i))
        b.ret_void()
        return f.fn

    @staticmethod
    def _while(b: ir.IRBuilder, start: ir.Value, bound, test, step) -> ir.Value:
        """x = start; while bound(x) and test(x): x = step(x); the final x."""
        pre = b.block
        head = b.append_basic_block("w.head")
        check = b.append_basic_block("w.check")
        body = b.append_basic_block("w.body")
        done = b.append_basic_block("w.done")
        b.branch(head)
        b.position_at_end(head)
        x = b.phi(u.i64)
        x.add_incoming(start, pre)
        b.cbranch(bound(x), check, done)
        b.position_at_end(check)
        b.cbranch(test(x), body, done)
        b.position_at_end(body)
        nxt = step(x)
        x.add_incoming(nxt, b.block)
        b.branch(head)
        b.position_at_end(done)
        return x

    # -- one group's blocks ----------------------------------------------------------------

    def _run_fn(self, live: ir.Function | None) -> ir.Function:
        """run(g, block0, block1, part, qbuf, pbuf): the online softmax of group g over its key
        blocks [block0, block1), left in `part` (per row: m, l, O). Per block, every row's
        scores and softmax step (p to pbuf, one row of kb per query row, then the rows'
        exp(m - m') after them), then O = O a + p V in register tiles of rows."""
        cfg, lanes = self.cfg, self.lanes
        f = _Fn(self.module, f"{self.name}_run", u.void, [u.i64, u.i64, u.i64, FP, FP, FP])
        b, (g, blk0, blk1, part, qbuf, pbuf) = f.b, f.args
        bi, hk = b.sdiv(g, f.s[HK]), b.srem(g, f.s[HK])
        grp, lq = f.group(), f.s[L]
        rows = b.mul(grp, lq)
        scale = b.bitcast(b.trunc(f.s[SCALE], u.i32), u.f32)
        zero = ir.Constant(self.vty, [0.0] * lanes)
        with u.for_range(b, u.const(0), rows, name="init") as r:
            base = b.mul(r, u.const(self.part))
            b.store(ir.Constant(u.f32, NEG_INF), u.gep(b, part, base))
            b.store(ir.Constant(u.f32, 0.0), u.gep(b, part, b.add(base, u.const(1))))
            for c in range(cfg.evv):
                b.store(zero, u.vptr(b, u.gep(b, part, b.add(base, u.const(2 + c * lanes))),
                                     lanes), align=4)
        sqd = f.s[Q_STRIDES + 3]
        with u.for_range(b, u.const(0), grp, name="qh") as gi:
            h = b.add(b.mul(hk, grp), gi)
            with u.for_range(b, u.const(0), lq, name="qi") as i:
                src = self._row_ptr(f, 0, Q_STRIDES, bi, h, i)
                dst = u.gep(b, qbuf, b.mul(b.add(b.mul(gi, lq), i), u.const(self.ep)))
                with u.for_range(b, u.const(0), u.const(cfg.e), name="qd") as d:
                    b.store(b.fmul(b.load(u.gep(b, src, b.mul(d, sqd))), scale), u.gep(b, dst, d))
                for d in range(cfg.e, self.ep):  # zeros past E: the padded lanes add nothing
                    b.store(ir.Constant(u.f32, 0.0), u.gep(b, dst, d))
        kend = self._kend(f)
        with u.for_range(b, blk0, blk1, name="blk") as blk:
            j0 = b.mul(blk, u.const(cfg.kb))
            kn = u.smin(b, u.const(cfg.kb), b.sub(kend, j0))

            def block() -> None:
                with b.if_else(b.icmp_signed("==", kn, u.const(cfg.kb))) as (full, tail):
                    for flag, branch in ((True, full), (False, tail)):
                        with branch, u.for_range(b, u.const(0), grp, name="rh") as gi:
                            h = b.add(b.mul(hk, grp), gi)
                            with u.for_range(b, u.const(0), lq, name="ri") as i:
                                r = b.add(b.mul(gi, lq), i)
                                self._scores(f, bi, hk, h, i, r, j0, kn, flag, part, qbuf, pbuf,
                                             rows)
                self._pv(f, bi, hk, j0, kn, rows, part, pbuf)

            if live is None:
                block()
            else:  # a block whose mask excludes every key is never read
                with b.if_then(self._live(f, live, bi, hk, j0, kn)):
                    block()
        b.ret_void()
        return f.fn

    def _scores(self, f: _Fn, bi, hk, h, i, r, j0, kn, full: bool, part, qbuf, pbuf,
                rows) -> None:
        """Row r's scores on the block and its online-softmax step: p and exp(m - m') to
        pbuf."""
        cfg, lanes, b = self.cfg, self.lanes, f.b
        qrow = u.gep(b, qbuf, b.mul(r, u.const(self.ep)))
        qv = [b.load(u.vptr(b, u.gep(b, qrow, c * lanes), lanes), align=4)
              for c in range(cfg.ec)]
        kbase = u.gep(b, f.ptr(1), f.offset(K_STRIDES, bi, hk))
        skj = f.s[K_STRIDES + 2]
        last = b.add(j0, b.sub(kn, u.const(1)))

        def dot(j: int) -> ir.Value:
            key = b.add(j0, u.const(j))
            if not full:  # a key past the block's end reads the last one; its score is masked
                key = u.smin(b, key, last)
            krow = u.gep(b, kbase, b.mul(key, skj))
            acc = None
            for c in range(cfg.ec):
                kv = masked_load(b, u.gep(b, krow, c * lanes), self.vty, self._tail_mask(c, cfg.e))
                acc = b.fmul(qv[c], kv) if acc is None else u.fma(b, qv[c], kv, acc)
            return acc if acc is not None else ir.Constant(self.vty, [0.0] * lanes)

        def fold(first: int, count: int) -> ir.Value:
            if count == 1:
                return dot(first)
            x, y = fold(first, count // 2), fold(first + count // 2, count // 2)
            lo, hi = _fold_indices(lanes, lanes * 2 // count)
            pick = [ir.Constant(u.vec(u.i32, lanes), idx) for idx in (lo, hi)]
            return b.fadd(b.shuffle_vector(x, y, pick[0]), b.shuffle_vector(x, y, pick[1]))

        mrow = None
        if cfg.mask != "none":
            mrow = u.gep(b, f.ptr(3, u.i8 if cfg.mask == "bool" else u.f32),
                         b.add(f.offset(M_STRIDES, bi, h, i), j0))
        scores = []
        for v in range(cfg.kb // lanes):
            s = fold(v * lanes, lanes)
            lane = self._iota(v * lanes, lanes)
            keep = None if full else b.icmp_signed("<", lane, u.splat(b, kn, lanes))
            if cfg.causal:
                seen = b.icmp_signed("<=", b.add(lane, u.splat(b, j0, lanes)),
                                     u.splat(b, i, lanes))
                keep = seen if keep is None else b.and_(keep, seen)
            if mrow is not None:
                ety = u.i8 if cfg.mask == "bool" else u.f32
                m = masked_load(b, u.gep(b, mrow, v * lanes), u.vec(ety, lanes), keep if not full
                               else None)
                if cfg.mask == "bool":
                    kept = b.icmp_unsigned("!=", m, ir.Constant(m.type, [0] * lanes))
                    keep = kept if keep is None else b.and_(keep, kept)
                else:
                    s = b.fadd(s, m)
            if keep is not None:
                s = b.select(keep, s, ir.Constant(self.vty, [NEG_INF] * lanes))
            scores.append(s)
        alpha = self._softmax_step(b, scores, u.gep(b, part, b.mul(r, u.const(self.part))),
                                   u.gep(b, pbuf, b.mul(r, u.const(cfg.kb))))
        b.store(alpha, u.gep(b, pbuf, b.add(b.mul(rows, u.const(cfg.kb)), r)))

    def _softmax_step(self, b: ir.IRBuilder, s: list[ir.Value], row: ir.Value, pbuf) -> ir.Value:
        """m' = max(m, max s); l = l exp(m - m') + sum exp(s - m'); p to pbuf; exp(m - m')."""
        lanes = self.lanes
        top = s[0]
        for x in s[1:]:
            top = self._vmax(b, top, x)
        m_old = b.load(row)
        m_new = self._vmax(b, m_old, hreduce(b, top, lambda x, y: self._vmax(b, x, y)))
        m_safe = b.select(b.fcmp_ordered("==", m_new, ir.Constant(u.f32, NEG_INF)),
                          ir.Constant(u.f32, 0.0), m_new)
        alpha = self._exp(b, b.fsub(m_old, m_safe))
        msplat = u.splat(b, m_safe, lanes)
        total = None
        for v, x in enumerate(s):
            p = self._exp(b, b.fsub(x, msplat))
            b.store(p, u.vptr(b, u.gep(b, pbuf, v * lanes), lanes), align=4 * lanes)
            total = p if total is None else b.fadd(total, p)
        lptr = u.gep(b, row, 1)
        b.store(b.fadd(b.fmul(b.load(lptr), alpha), hreduce(b, total, b.fadd)), lptr)
        b.store(m_new, row)
        return alpha

    def _pv(self, f: _Fn, bi, hk, j0, kn, rows, part, pbuf) -> None:
        """O = O a + sum over the block's keys of p[j] V[j] for every row, a tile of rows at a
        time (each V row read once per tile), Ev in passes of `pv_tile` vectors."""
        cfg, b = self.cfg, f.b
        tile, cols = cfg.pv_tile
        sizes = tuple(range(tile, 0, -1))
        with u.for_chunks(b, u.const(0), rows, sizes, name="pvr") as (r0, chunk):
            for size in sizes:
                with b.if_then(b.icmp_signed("==", chunk, u.const(size))):
                    for c0 in range(0, cfg.evv, cols):
                        self._pv_tile(f, bi, hk, j0, kn, rows, part, pbuf, r0, size,
                                      range(c0, min(cfg.evv, c0 + cols)))

    def _pv_tile(self, f: _Fn, bi, hk, j0, kn, rows, part, pbuf, r0, size: int, cs) -> None:
        cfg, lanes, b = self.cfg, self.lanes, f.b
        vbase = u.gep(b, f.ptr(2), f.offset(V_STRIDES, bi, hk))
        svj = f.s[V_STRIDES + 2]
        optrs, inits, prows = [], [], []
        for t in range(size):
            r = b.add(r0, u.const(t))
            prows.append(u.gep(b, pbuf, b.mul(r, u.const(cfg.kb))))
            a = u.splat(b, b.load(u.gep(b, pbuf, b.add(b.mul(rows, u.const(cfg.kb)), r))), lanes)
            orow = u.gep(b, part, b.add(b.mul(r, u.const(self.part)), u.const(2)))
            for c in cs:
                ptr = u.vptr(b, u.gep(b, orow, c * lanes), lanes)
                optrs.append(ptr)
                inits.append(b.fmul(b.load(ptr, align=4), a))
        with u.for_range_carry(b, u.const(0), kn, 1, inits, name="pv") as loop:
            vrow = u.gep(b, vbase, b.mul(b.add(j0, loop.index), svj))
            vv = [masked_load(b, u.gep(b, vrow, c * lanes), self.vty, self._tail_mask(c, cfg.ev))
                  for c in cs]
            nxt = []
            for t in range(size):
                p = u.splat(b, b.load(u.gep(b, prows[t], loop.index)), lanes)
                accs = loop.values[t * len(vv):(t + 1) * len(vv)]
                nxt += [u.fma(b, p, x, acc) for x, acc in zip(vv, accs, strict=True)]
            loop.next = nxt
        for ptr, value in zip(optrs, loop.result, strict=True):
            b.store(value, ptr, align=4)

    # -- writing a group's rows ------------------------------------------------------------

    def _finish_fn(self) -> ir.Function:
        """finish(g, part, parts, count): out rows of group g from `count` partial slots
        (`parts[t]`, t < count: floats pointers), zeros where no key was seen."""
        cfg, lanes = self.cfg, self.lanes
        f = _Fn(self.module, f"{self.name}_finish", u.void, [u.i64, I64P, u.i64])
        b, (g, parts, count) = f.b, f.args
        bi, hk = b.sdiv(g, f.s[HK]), b.srem(g, f.s[HK])
        grp, lq = f.group(), f.s[L]
        zero = ir.Constant(self.vty, [0.0] * lanes)
        neg = ir.Constant(u.f32, NEG_INF)
        with u.for_range(b, u.const(0), grp, name="fh") as gi:
            h = b.add(b.mul(hk, grp), gi)
            with u.for_range(b, u.const(0), lq, name="fi") as i:
                base = b.mul(b.add(b.mul(gi, lq), i), u.const(self.part))

                def row(t):
                    return u.gep(b, b.inttoptr(b.load(u.gep(b, parts, t)), FP), base)

                with u.for_range_carry(b, u.const(0), count, 1, [neg], name="fm") as top:
                    top.next = [self._vmax(b, top.values[0], b.load(row(top.index)))]
                m = top.result[0]
                m_safe = b.select(b.fcmp_ordered("==", m, neg), ir.Constant(u.f32, 0.0), m)
                inits = [ir.Constant(u.f32, 0.0)] + [zero] * cfg.evv
                with u.for_range_carry(b, u.const(0), count, 1, inits, name="fs") as acc:
                    src = row(acc.index)
                    w = self._exp(b, b.fsub(b.load(src), m_safe))
                    ws = u.splat(b, w, lanes)
                    nxt = [b.fadd(acc.values[0], b.fmul(w, b.load(u.gep(b, src, 1))))]
                    for c in range(cfg.evv):
                        o = b.load(u.vptr(b, u.gep(b, src, 2 + c * lanes), lanes), align=4)
                        nxt.append(u.fma(b, ws, o, acc.values[1 + c]))
                    acc.next = nxt
                total, *o = acc.result
                inv = b.select(b.fcmp_ordered(">", total, ir.Constant(u.f32, 0.0)),
                               b.fdiv(ir.Constant(u.f32, 1.0), total), ir.Constant(u.f32, 0.0))
                self._store_row(f, bi, h, i, [b.fmul(x, u.splat(b, inv, lanes)) for x in o])
        b.ret_void()
        return f.fn

    def _store_row(self, f: _Fn, bi, h, i, values: list[ir.Value]) -> None:
        b, lanes = f.b, self.lanes
        orow = self._row_ptr(f, 4, O_STRIDES, bi, h, i)
        for c, value in enumerate(values):
            dst = u.vptr(b, u.gep(b, orow, c * lanes), lanes)
            mask = self._tail_mask(c, self.cfg.ev)
            if mask is None:
                b.store(value, dst, align=4)
            else:
                u.masked_store(b, value, dst, mask)

    # -- the worker ------------------------------------------------------------------------

    def emit(self) -> ir.Function:
        cfg = self.cfg
        self.part = 2 + self.evp
        live = None
        if cfg.mask != "none":
            live = block_live_fn(self.module, f"{self.name}_live", cfg.mask, cfg.causal,
                                 self.lanes, cfg.kb)
        bounds, run, finish = self._bounds_fn(live), self._run_fn(live), self._finish_fn()
        fn = ir.Function(self.module, WORKER_TYPE, name=f"{self.name}_worker")
        fn.linkage = "internal"
        ctx, tid32, nth32 = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        memo = b.alloca(u.i64, 3, name="memo")  # bounds' last answer: group, blocks lo, hi
        mine = b.alloca(u.i64, 2, name="mine")  # this thread's two partial slots (addresses)
        head = b.alloca(u.i64, 3, name="head")  # the split group it combines: g, slot, last
        split_any = b.alloca(u.i1, name="split_any")
        slots = b.bitcast(ctx, I64P)
        s = [b.load(u.gep(b, slots, i)) for i in range(SLOTS)]
        tid, nth = b.sext(tid32, u.i64), b.sext(nth32, u.i64)
        nothing = b.or_(b.icmp_signed("==", s[HK], u.const(0)),
                        b.icmp_signed("==", b.mul(s[B], s[H]), u.const(0)))
        with b.if_then(nothing):
            b.ret_void()
        grp = b.sdiv(s[H], s[HK])
        rows = b.mul(grp, s[L])
        groups = b.mul(s[B], s[HK])
        b.store(u.const(-1), memo)
        b.store(u.const(-1), head)
        b.store(ir.Constant(u.i1, 0), split_any)
        qbuf = self._alloca(b, b.mul(rows, u.const(self.ep)), "qbuf")
        pbuf = self._alloca(b, b.mul(rows, u.const(cfg.kb + 1)), "pbuf")
        partbuf = self._alloca(b, b.mul(rows, u.const(2 * self.part)), "parts")
        for k in range(2):
            addr = b.ptrtoint(u.gep(b, partbuf, b.mul(rows, u.const(k * self.part))), u.i64)
            b.store(addr, u.gep(b, mine, k))
        b.store(b.load(mine), u.gep(b, slots, b.add(tid, u.const(SLOTS))))

        def blocks(g: ir.Value) -> tuple[ir.Value, ir.Value]:
            b.call(bounds, [slots, g, memo])
            return b.load(u.gep(b, memo, 1)), b.load(u.gep(b, memo, 2))

        with u.for_range_carry(b, u.const(0), groups, 1, [u.const(0)], name="count") as cnt:
            lo, hi = blocks(cnt.index)
            cnt.next = [b.add(cnt.values[0], b.sub(hi, lo))]
        total = cnt.result[0]
        t0 = b.sdiv(b.mul(total, tid), nth)
        t1 = b.sdiv(b.mul(total, b.add(tid, u.const(1))), nth)

        def thread_of(x: ir.Value) -> ir.Value:  # the thread whose share holds block x
            return b.sdiv(b.sub(b.mul(b.add(x, u.const(1)), nth), u.const(1)), total)

        with u.for_range_carry(b, u.const(0), groups, 1, [u.const(0)], name="walk") as walk:
            g, off = walk.index, walk.values[0]
            lo, hi = blocks(g)
            nb = b.sub(hi, lo)
            end = b.add(off, nb)
            with b.if_else(b.icmp_signed("==", nb, u.const(0))) as (empty, some):
                with empty, b.if_then(b.icmp_signed("==", b.srem(g, nth), tid)):
                    b.call(finish, [slots, g, mine, u.const(0)])  # zeros
                with some:
                    last = thread_of(b.sub(end, u.const(1)))
                    split = b.icmp_signed("!=", thread_of(off), last)
                    b.store(b.or_(b.load(split_any), split), split_any)
                    a, z = u.smax(b, off, t0), u.smin(b, end, t1)
                    with b.if_then(b.icmp_signed("<", a, z)):
                        slot = b.select(b.icmp_signed("==", a, t0), u.const(0), u.const(1))
                        part = b.inttoptr(b.load(b.gep(mine, [slot])), FP)
                        b.call(run, [slots, g, b.add(lo, b.sub(a, off)),
                                     b.add(lo, b.sub(z, off)), part, qbuf, pbuf])
                        with b.if_else(split) as (shared, whole):
                            with shared, b.if_then(b.icmp_signed("==", a, off)):
                                for k, x in enumerate((g, slot, last)):
                                    b.store(x, u.gep(b, head, k))
                            with whole:
                                b.call(finish, [slots, g, b.gep(mine, [slot]), u.const(1)])
            walk.next = [end]
        together = b.and_(b.load(split_any), b.icmp_signed(">", nth, u.const(1)))
        with b.if_then(together):
            barrier = u.intrinsic(self.module, "tilefold_barrier", u.void, [u.i32])
            b.call(barrier, [tid32])
            hg = b.load(head)
            with b.if_then(b.icmp_signed(">=", hg, u.const(0))):
                # the parts: this thread's slot, then slot 0 of each later thread on the group
                # (a thread whose share is empty has none)
                later = b.sub(b.load(u.gep(b, head, 2)), tid)
                parts = b.alloca(u.i64, b.add(later, u.const(1)), name="parts_of_group")
                b.store(b.load(b.gep(mine, [b.load(u.gep(b, head, 1))])), parts)
                with u.for_range_carry(b, u.const(1), b.add(later, u.const(1)), 1,
                                       [u.const(1)], name="gather") as gather:
                    t = b.add(tid, gather.index)
                    start = b.sdiv(b.mul(total, t), nth)
                    stop = b.sdiv(b.mul(total, b.add(t, u.const(1))), nth)
                    n = gather.values[0]
                    b.store(b.load(b.gep(slots, [b.add(t, u.const(SLOTS))])), b.gep(parts, [n]))
                    gather.next = [b.select(b.icmp_signed("<", start, stop),
                                            b.add(n, u.const(1)), n)]
                count = gather.result[0]
                b.call(finish, [slots, hg, parts, count])
            b.call(barrier, [tid32])  # the slots live on their threads' stacks until here
        b.ret_void()
        return fn

    @staticmethod
    def _alloca(b: ir.IRBuilder, floats: ir.Value, name: str) -> ir.Value:
        ptr = b.alloca(u.f32, floats, name=name)
        ptr.align = 64
        return ptr
