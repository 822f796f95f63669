"""LLVM IR of the fused attention backward (`attention_backward`): flash attention's, on CPU.

A task is one (batch, head); tasks are split over the native pool, so each task owns its rows
of dq, dk and dv and needs no atomics. Per block of KB keys (`AttentionConfig.tile`, as the
forward kernel's) and block of QB query rows:

    Kt, Vt = K[block]^T, V[block]^T        packed once per key block (zeros past the keys)
    for ROWS query rows at a time:         register tiles ROWS x KB
        p  = exp(q · Kt * scale + bias - lse)              -> pbuf (QB x KB)
        ds = p * (dout · Vt - delta) * scale               -> sbuf (QB x KB)
    dV[block] += pbuf^T · dout[rows]       accumulated in a stack buffer over the query blocks
    dK[block] += sbuf^T · q[rows]          likewise
    dq[rows]  += sbuf · K[block]           in place in dq (zeroed when the task starts)

The probabilities are recomputed from each row's log-sum-exp and never leave the core's caches
(two 16 KB buffers with 64 keys a block); `delta` (each row's <dout, out>) comes in, so the
kernel makes one pass. Every product is the same register tile (`_Worker._product`): rows of
C += a broadcast scalar of A times vectors of B's rows.
Dims and strides are read from the array objects at run time; the last dim of every operand
but lse and delta is contiguous (the Python side copies where it is not).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.attention.entry import begin_worker, read_array, run_worker
from tilefold.codegen.llvm.attention.flash import TILES
from tilefold.codegen.llvm.vecmath.builder import MathBuilder
from tilefold.codegen.llvm.vecmath.exp_log import exp_nonpositive

QB = 64  # query rows whose probabilities and score gradients are buffered at a time (32 and 128
# ran at the same speed on MiniLM's heads)
# The entry's array operands, in order; `bias` only where the config has one.
ARRAYS = ("dout", "q", "k", "v", "lse", "delta", "bias", "dq", "dk", "dv")
_AT = {name: i for i, name in enumerate(ARRAYS)}
B, H, L, S = range(len(ARRAYS), len(ARRAYS) + 4)  # q's batch, heads, rows; k's rows
STRIDES = S + 1  # four element strides per array from here, in ARRAYS' order
SCALE = STRIDES + 4 * len(ARRAYS)
SLOTS = SCALE + 1
FP = u.f32.as_pointer()


@dataclass(frozen=True)
class BackwardConfig:
    """What a compiled backward kernel is specialized for (everything else is read at run
    time)."""

    e: int  # q/k feature dim
    ev: int  # v feature dim
    bias: bool  # an additive float bias (masks, the causal triangle) broadcast to the scores
    lanes: int  # f32 lanes per vector
    threads: int
    registers: int = 32  # vector registers of the ISA

    @property
    def tile(self) -> tuple[int, int, int]:
        """(query rows, key vectors, accumulators) of a register tile, as the forward's."""
        return TILES[32 if self.registers >= 32 else 16]

    @property
    def kb(self) -> int:
        return self.tile[1] * self.lanes

    def width(self, n: int) -> int:
        """Floats of a row of n features padded to whole vectors."""
        return -(-n // self.lanes) * self.lanes


def backward_ir(cfg: BackwardConfig, name: str, triple: str, features: frozenset[str]) -> str:
    """The module holding `name(dout, q, k, v, lse, delta, [bias], dq, dk, dv, float scale)`
    on rank-4 array objects (lse and delta with a trailing dim of 1)."""
    module = ir.Module(name=name)
    module.triple = triple
    worker = _Worker(module, cfg, f"{name}_worker", features).emit()
    _emit_entry(module, name, cfg, worker)
    return str(module)


def _emit_entry(module: ir.Module, name: str, cfg: BackwardConfig, worker: ir.Function) -> None:
    i8p = u.i8.as_pointer()
    names = [n for n in ARRAYS if n != "bias" or cfg.bias]
    fn = ir.Function(module, ir.FunctionType(u.void, [i8p] * len(names) + [u.f32]), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx = b.alloca(ir.ArrayType(u.i64, SLOTS), name="ctx")
    slots = b.bitcast(ctx, u.i64.as_pointer())

    def put(slot: int, value) -> None:
        b.store(value, u.gep(b, slots, slot))

    fields = {n: read_array(b, obj, 4) for n, obj in zip(names, fn.args, strict=False)}
    for n in ARRAYS:
        data, _, strides = fields.get(n, (u.const(0), None, [u.const(0)] * 4))
        put(_AT[n], data)
        for i, stride in enumerate(strides):
            put(STRIDES + 4 * _AT[n] + i, stride)
    q_dims, k_dims = fields["q"][1], fields["k"][1]
    for slot, value in ((B, q_dims[0]), (H, q_dims[1]), (L, q_dims[2]), (S, k_dims[2])):
        put(slot, value)
    put(SCALE, b.zext(b.bitcast(fn.args[-1], u.i32), u.i64))
    run_worker(b, worker, b.bitcast(ctx, i8p), cfg.threads)
    b.ret_void()


class _Worker:
    """Emits `worker(ctx, tid, nthreads)`: this thread's share of the (batch, head) tasks."""

    def __init__(self, module: ir.Module, cfg: BackwardConfig, name: str,
                 features: frozenset[str]):
        self.module, self.cfg, self.name, self.features = module, cfg, name, features
        self.vty = u.vec(u.f32, cfg.lanes)
        self.zero = ir.Constant(self.vty, [0.0] * cfg.lanes)

    def emit(self) -> ir.Function:
        cfg = self.cfg
        fn, b, self.slot = begin_worker(self.module, self.name, SLOTS)
        self.b = b
        _, tid, nth = fn.args
        kb = cfg.kb
        self.kt = u.float_buffer(b, cfg.e * kb, "kt")
        self.vt = u.float_buffer(b, cfg.ev * kb, "vt")
        self.pbuf = u.float_buffer(b, QB * kb, "pbuf")
        self.sbuf = u.float_buffer(b, QB * kb, "sbuf")
        self.dkb = u.float_buffer(b, kb * cfg.width(cfg.e), "dkb")
        self.dvb = u.float_buffer(b, kb * cfg.width(cfg.ev), "dvb")
        self.scale = b.bitcast(b.trunc(self.slot[SCALE], u.i32), u.f32)
        s = self.slot
        tasks = b.mul(s[B], s[H])
        t, n = b.sext(tid, u.i64), b.sext(nth, u.i64)
        t0 = b.sdiv(b.mul(tasks, t), n)
        t1 = b.sdiv(b.mul(tasks, b.add(t, u.const(1))), n)
        with u.for_range(b, t0, t1, name="task") as task:
            self._task(b.sdiv(task, s[H]), b.srem(task, s[H]))
        b.ret_void()
        return fn

    def _stride(self, array: str, dim: int) -> ir.Value:
        return self.slot[STRIDES + 4 * _AT[array] + dim]

    def _base(self, array: str, bi: ir.Value, h: ir.Value) -> ir.Value:
        """Where (bi, h)'s rows of `array` start."""
        b = self.b
        offset = b.add(b.mul(bi, self._stride(array, 0)), b.mul(h, self._stride(array, 1)))
        return u.gep(b, b.inttoptr(self.slot[_AT[array]], FP), offset)

    def _row(self, array: str, base: ir.Value, row: ir.Value) -> ir.Value:
        return u.gep(self.b, base, self.b.mul(row, self._stride(array, 2)))

    def _task(self, bi: ir.Value, h: ir.Value) -> None:
        b, cfg, s = self.b, self.cfg, self.slot
        self.at = {n: self._base(n, bi, h) for n in ARRAYS if n != "bias" or cfg.bias}
        with u.for_range(b, u.const(0), s[L], name="zq") as r:  # dq accumulates from zero
            row = self._row("dq", self.at["dq"], r)
            for c in range(-(-cfg.e // cfg.lanes)):
                self._store(self.zero, u.gep(b, row, c * cfg.lanes), cfg.e, c)
        with u.for_range(b, u.const(0), s[S], cfg.kb, name="kblock") as j0:
            self.j0 = j0
            self.kn = u.smin(b, u.const(cfg.kb), b.sub(s[S], j0))
            self._key_block()

    def _key_block(self) -> None:
        b, cfg, s = self.b, self.cfg, self.slot
        self._pack(self.kt, "k", cfg.e)
        self._pack(self.vt, "v", cfg.ev)
        for buf, n in ((self.dkb, cfg.e), (self.dvb, cfg.ev)):
            with u.for_range(b, u.const(0), u.const(cfg.kb * cfg.width(n) // cfg.lanes),
                             name="zb") as i:
                b.store(self.zero, u.vptr(b, u.gep(b, buf, b.mul(i, u.const(cfg.lanes))),
                                          cfg.lanes), align=64)
        with u.for_range(b, u.const(0), s[L], QB, name="qblock") as i0:
            self.i0 = i0
            self.nrows = u.smin(b, u.const(QB), b.sub(s[L], i0))
            self._query_block()
        for buf, out, n in ((self.dkb, "dk", cfg.e), (self.dvb, "dv", cfg.ev)):
            with u.for_range(b, u.const(0), self.kn, name="st") as jj:
                dst = self._row(out, self.at[out], b.add(self.j0, jj))
                src = u.gep(b, buf, b.mul(jj, u.const(cfg.width(n))))
                for c in range(-(-n // cfg.lanes)):
                    value = b.load(u.vptr(b, u.gep(b, src, c * cfg.lanes), cfg.lanes), align=64)
                    self._store(value, u.gep(b, dst, c * cfg.lanes), n, c)

    def _pack(self, buf: ir.Value, array: str, n: int) -> None:
        """buf[d, jj] = array[j0 + jj, d] for the block's keys, zeros past them."""
        b, cfg = self.b, self.cfg
        for i in range(n * cfg.kb // cfg.lanes):
            b.store(self.zero, u.vptr(b, u.gep(b, buf, i * cfg.lanes), cfg.lanes), align=64)
        with u.for_range(b, u.const(0), self.kn, name=f"p{array}") as jj:
            row = self._row(array, self.at[array], b.add(self.j0, jj))
            for d in range(n):
                b.store(b.load(u.gep(b, row, d)), u.gep(b, buf, b.add(u.const(d * cfg.kb), jj)))

    def _query_block(self) -> None:
        b, cfg = self.b, self.cfg
        rows = cfg.tile[0]
        full = b.sub(self.nrows, b.srem(self.nrows, u.const(rows)))
        with u.for_range(b, u.const(0), full, rows, name="rows") as r0:
            self._scores(r0, rows)
        with u.for_range(b, full, self.nrows, name="row") as r0:
            self._scores(r0, 1)
        kb, i0, j0 = cfg.kb, self.i0, self.j0
        for buf, src, out, n in ((self.pbuf, "dout", self.dvb, cfg.ev),
                                 (self.sbuf, "q", self.dkb, cfg.e)):
            # out[jj] += sum over rows r of buf[r, jj] * src[i0 + r]
            self._product(
                self.kn, lambda jj, out=out, n=n: u.gep(b, out, b.mul(jj, u.const(cfg.width(n)))),
                lambda jj, r, buf=buf: u.gep(b, buf, b.add(b.mul(r, u.const(kb)), jj)),
                lambda r, src=src: self._row(src, self.at[src], b.add(i0, r)),
                self.nrows, n)
        # dq[i0 + r] += sum over keys jj of sbuf[r, jj] * k[j0 + jj]
        self._product(
            self.nrows, lambda r: self._row("dq", self.at["dq"], b.add(i0, r)),
            lambda r, jj: u.gep(b, self.sbuf, b.add(b.mul(r, u.const(kb)), jj)),
            lambda jj: self._row("k", self.at["k"], b.add(j0, jj)),
            self.kn, cfg.e)

    def _scores(self, r0: ir.Value, rows: int) -> None:
        """pbuf and sbuf for query rows r0 .. r0 + rows of the block."""
        b, cfg = self.b, self.cfg
        lanes, kv = cfg.lanes, cfg.tile[1]
        scale = u.splat(b, self.scale, lanes)
        keys = [b.icmp_signed("<", ir.Constant(u.vec(u.i64, lanes),
                                               list(range(v * lanes, (v + 1) * lanes))),
                              u.splat(b, self.kn, lanes)) for v in range(kv)]
        qrows = [b.add(self.i0, b.add(r0, u.const(r))) for r in range(rows)]
        scores = self._dots("q", self.kt, qrows, cfg.e)
        for r, row in enumerate(qrows):
            lse = b.load(self._row("lse", self.at["lse"], row))
            # a row that kept no key (lse -inf) gets p = 0, not exp(-inf + inf)
            lse = b.select(b.fcmp_ordered("==", lse, ir.Constant(u.f32, float("-inf"))),
                           ir.Constant(u.f32, float("inf")), lse)
            lse = u.splat(b, lse, lanes)
            bias = self._row("bias", self.at["bias"], row) if cfg.bias else None
            for v in range(kv):
                x = b.fmul(scores[r][v], scale)
                if bias is not None:
                    ptr = u.vptr(b, u.gep(b, bias, b.add(self.j0, u.const(v * lanes))), lanes)
                    x = b.fadd(x, u.masked_load(b, ptr, keys[v], lanes))
                p = exp_nonpositive(MathBuilder(b, self.vty, self.features), b.fsub(x, lse))
                b.store(b.select(keys[v], p, self.zero), self._tile(self.pbuf, r0, r, v),
                        align=64)
        grads = self._dots("dout", self.vt, qrows, cfg.ev)
        for r, row in enumerate(qrows):
            delta = u.splat(b, b.load(self._row("delta", self.at["delta"], row)), lanes)
            for v in range(kv):
                p = b.load(self._tile(self.pbuf, r0, r, v), align=64)
                ds = b.fmul(b.fmul(p, b.fsub(grads[r][v], delta)), scale)
                b.store(ds, self._tile(self.sbuf, r0, r, v), align=64)

    def _tile(self, buf: ir.Value, r0: ir.Value, r: int, v: int) -> ir.Value:
        cfg, b = self.cfg, self.b
        at = b.add(b.mul(b.add(r0, u.const(r)), u.const(cfg.kb)), u.const(v * cfg.lanes))
        return u.vptr(b, u.gep(b, buf, at), cfg.lanes)

    def _dots(self, array: str, packed: ir.Value, rows: list[ir.Value], n: int
              ) -> list[list[ir.Value]]:
        """acc[r][v] = array[rows[r]] · packed[:, v-th vector] over n features."""
        b, cfg = self.b, self.cfg
        kv = cfg.tile[1]
        ptrs = [self._row(array, self.at[array], row) for row in rows]
        with u.for_range_carry(b, u.const(0), u.const(n), 1, [self.zero] * (len(rows) * kv),
                               name="dot") as loop:
            d = loop.index
            cols = [b.load(u.vptr(b, u.gep(b, packed, b.add(b.mul(d, u.const(cfg.kb)),
                                                              u.const(v * cfg.lanes))),
                                  cfg.lanes), align=64) for v in range(kv)]
            nxt = []
            for ptr in ptrs:
                x = u.splat(b, b.load(u.gep(b, ptr, d)), cfg.lanes)
                for col in cols:
                    nxt.append(u.fma(b, x, col, loop.values[len(nxt)]))
            loop.next = nxt
        acc = loop.result
        return [acc[r * kv:(r + 1) * kv] for r in range(len(rows))]

    def _mask(self, n: int, c: int) -> ir.Constant | None:
        """Lanes of vector c of an n-wide row that hold features (None: all)."""
        rest = n - c * self.cfg.lanes
        if rest >= self.cfg.lanes:
            return None
        return ir.Constant(u.vec(u.i1, self.cfg.lanes), [i < rest for i in range(self.cfg.lanes)])

    def _load(self, ptr: ir.Value, n: int, c: int) -> ir.Value:
        mask, vp = self._mask(n, c), u.vptr(self.b, ptr, self.cfg.lanes)
        if mask is None:
            return self.b.load(vp, align=4)
        return u.masked_load(self.b, vp, mask, self.cfg.lanes)

    def _store(self, value: ir.Value, ptr: ir.Value, n: int, c: int) -> None:
        mask, vp = self._mask(n, c), u.vptr(self.b, ptr, self.cfg.lanes)
        if mask is None:
            self.b.store(value, vp, align=4)
        else:
            u.masked_store(self.b, value, vp, mask)

    def _product(self, count: ir.Value, c_row, a_at, b_row, depth: ir.Value, n: int) -> None:
        """For i < count: row c_row(i) (n floats) += sum over k < depth of *a_at(i, k) times
        row b_row(k) (n floats), in register tiles of rows x vectors."""
        b = self.b
        vectors = -(-n // self.cfg.lanes)
        budget = self.cfg.tile[2]
        chunk = min(vectors, budget)
        rows = max(1, budget // chunk)
        for c0 in range(0, vectors, chunk):
            cs = range(c0, min(vectors, c0 + chunk))
            full = b.sub(count, b.srem(count, u.const(rows)))
            with u.for_range(b, u.const(0), full, rows, name="ti") as i0:
                self._product_tile(i0, rows, cs, c_row, a_at, b_row, depth, n)
            with u.for_range(b, full, count, name="tr") as i0:
                self._product_tile(i0, 1, cs, c_row, a_at, b_row, depth, n)

    def _product_tile(self, i0, rows: int, cs: range, c_row, a_at, b_row, depth, n: int) -> None:
        b = self.b
        lanes = self.cfg.lanes
        idx = [b.add(i0, u.const(r)) for r in range(rows)]
        cptrs = [[u.gep(b, c_row(i), c * lanes) for c in cs] for i in idx]
        inits = [self._load(p, n, c) for ps in cptrs for p, c in zip(ps, cs, strict=True)]
        with u.for_range_carry(b, u.const(0), depth, 1, inits, name="tk") as loop:
            k = loop.index
            brow = b_row(k)
            bv = [self._load(u.gep(b, brow, c * lanes), n, c) for c in cs]
            nxt = []
            for i in idx:
                a = u.splat(b, b.load(a_at(i, k)), lanes)
                for x in bv:
                    nxt.append(u.fma(b, a, x, loop.values[len(nxt)]))
            loop.next = nxt
        for p, c, value in zip([p for ps in cptrs for p in ps], list(cs) * rows, loop.result,
                               strict=True):
            self._store(value, p, n, c)
