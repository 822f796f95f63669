"""The register-tile micro-kernel generator: C[mr, nv*VL] (+)= A_panel @ B_panel over kc steps.

One generator serves every ISA: the ISA-specific parts are the vector width, how an element of A
reaches all lanes (a broadcast load on x86, `fmla` by element on NEON) and the tile shape, all
chosen by the registry entry. A comes packed (`mr` floats per k) or, for `a_direct` variants, in
place (row i at `a + i * lda`, contiguous along k).

The kernels are most of a GEMM module's instructions (an 8x48 step is 24 FMAs, the 28-row tile
unrolled 112), so they are written as IR text (`IRText`) rather than with llvmlite's builder,
which made building them most of a module's first-use compile time. The IR needs no loop
strength reduction from LLVM (the module is compiled without it): pointers advance in phis and
rows of A in place are addressed from a few bases (see `_ROW_GROUP`).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from tilefold.codegen.llvm import util as u

# Signature shared by every variant, so the driver can call any of them through one table.
UKERNEL_TYPE = ir.FunctionType(
    u.void, [u.i64, u.f32.as_pointer(), u.i64, u.f32.as_pointer(), u.i64, u.f32.as_pointer(),
             u.i64, u.i32, u.i64, u.i8.as_pointer(), u.i64, u.i64])
# A read in place: row i is addressed as base_g + (i % 8) * lda, g = i // 8, each base 8 rows
# on from the last; the 8 offsets are loop-invariant (LLVM keeps them in registers), so x86
# addressing modes reach every row with one add per 8 rows and no loop strength reduction.
# An offset per row (28 for the narrow tile) would spill; a chain of `lda` adds ran 5% slower.
_ROW_GROUP = 8
_PROTOTYPE = ("(i64 %kc, ptr noalias %a, i64 %lda, ptr noalias %b, i64 %ldb, ptr noalias %c, "
              "i64 %ldc, i32 %beta, i64 %ncols, ptr %pf, i64 %pfstep, i64 %pfn)")


@dataclass(frozen=True)
class TileSpec:
    """One variant: `mr` rows by `nv` vectors of `lanes` floats.

    `a_lanes` > 1 selects NEON-style A access (load `a_lanes` elements, use them by lane);
    `a_direct` reads A in place (`lda` floats between rows) instead of from a packed panel.
    `nv_dynamic` serves every width up to `nv` vectors (masked B loads and C stores), one
    function instead of `nv`: for row tails, which carry too little work to earn a variant each.
    `b_prefetch` > 0 prefetches the B row that many k steps ahead (B streaming from L2).
    `stream` prefetches a line of the caller's stream (`%pf`, `%pfstep`, `%pfn`) per main-loop
    iteration; without it those arguments are ignored.
    `sets` > 1 keeps that many accumulator sets, k steps dealt among them in turn and summed
    at the end: a short tile's few FMA chains would otherwise wait on FMA latency (2 rows by
    2 vectors, 4 chains, took as long as a whole 6 x 16 tile on Zen). `unroll` is a multiple.
    """

    mr: int
    nv: int
    lanes: int
    unroll: int = 4
    a_lanes: int = 1
    a_direct: bool = False
    nv_dynamic: bool = False
    b_prefetch: int = 0
    sets: int = 1
    stream: bool = False

    def __post_init__(self):
        if self.a_direct and self.a_lanes > 1:
            raise ValueError("a_direct reads A by broadcast; lane-indexed A needs packed panels")
        if self.unroll % self.sets:
            raise ValueError(f"unroll {self.unroll} must deal its k steps among {self.sets} sets")

    @property
    def name(self) -> str:
        flags = ("v" if self.nv_dynamic else "") + ("d" if self.a_direct else "")
        sets = f"s{self.sets}" if self.sets > 1 else ""
        return f"tf_uk_{self.mr}x{self.nv}x{self.lanes}{flags}{sets}"


def emit_microkernel(module: ir.Module, spec: TileSpec) -> ir.Function:
    """Add the variant `spec` to `module`; B holds `ldb` floats per k, A `mr` (packed) or 1;
    the tile is `ncols` columns wide (the last vector partial, or with `nv_dynamic` fewer)."""
    vty = u.vec(u.f32, spec.lanes)
    u.fma_intrinsic(module, vty)
    u.masked_load_intrinsic(module, spec.lanes)
    u.masked_store_intrinsic(module, spec.lanes)
    u.prefetch_intrinsic(module)
    body = "\n".join(_Kernel(spec).lines)
    text = f'define internal void @"{spec.name}"{_PROTOTYPE}\n{{\n{body}\n}}\n'
    return u.TextFunction(module, UKERNEL_TYPE, spec.name, text)


class _Kernel(u.IRText):
    """The body of one variant, written on construction."""

    def __init__(self, spec: TileSpec):
        super().__init__()
        self.spec = spec
        vl = spec.lanes
        self.vty = f"<{vl} x float>"
        self.iota = "<" + ", ".join(f"i32 {i}" for i in range(vl)) + ">"
        self.label("entry")
        for i in range(spec.mr):
            self.prefetch(self.gep("%c", self.row(i, "%ldc")), write=1)
        self.masks = {v: self.lane_mask(self(f"sub i64 %ncols, {v * vl}") if v else "%ncols")
                      for v in range(spec.nv) if spec.nv_dynamic or v == spec.nv - 1}
        # B advances by bytes: a float-indexed step would be a scaled `lea` on x86, slower on
        # the loop-carried pointer than an add.
        self.b_step = self("mul i64 %ldb, 4")
        if spec.b_prefetch:
            self.b_ahead = self(f"mul i64 %ldb, {spec.b_prefetch}")
        if spec.a_direct:
            self.next_tile = self.gep("%a", self(f"mul i64 %lda, {spec.mr}"))
        accs = self.k_loops()
        self.epilogue(accs)

    # Instructions, each a line of text; values are names (or constants) as strings.

    def gep(self, ptr: str, offset: str | int) -> str:
        if offset == 0:
            return ptr
        return self(f"getelementptr inbounds float, ptr {ptr}, i64 {offset}")

    def row(self, i: int, stride: str) -> str:
        """Offset of row `i` (0 for the first)."""
        return self(f"mul i64 {i}, {stride}") if i else 0

    def splat(self, ty: str, scalar: str) -> str:
        lanes = self.spec.lanes
        one = self(f"insertelement <{lanes} x {ty}> undef, {ty} {scalar}, i32 0")
        return self(f"shufflevector <{lanes} x {ty}> {one}, <{lanes} x {ty}> undef, "
                    f"<{lanes} x i32> zeroinitializer")

    def lane_mask(self, count: str) -> str:
        """<lanes x i1> with the first `count` lanes set."""
        n = self.splat("i32", self(f"trunc i64 {count} to i32"))
        return self(f"icmp slt <{self.spec.lanes} x i32> {self.iota}, {n}")

    def load(self, ptr: str) -> str:
        return self(f"load {self.vty}, ptr {ptr}, align 4")

    def masked_load(self, ptr: str, mask: str) -> str:
        vl, vty = self.spec.lanes, self.vty
        return self(f"call {vty} @llvm.masked.load.v{vl}f32.p0(ptr {ptr}, i32 4, "
                    f"<{vl} x i1> {mask}, {vty} zeroinitializer)")

    def masked_store(self, value: str, ptr: str, mask: str) -> None:
        vl = self.spec.lanes
        self.emit(f"call void @llvm.masked.store.v{vl}f32.p0({self.vty} {value}, ptr {ptr}, "
                  f"i32 4, <{vl} x i1> {mask})")

    def prefetch(self, ptr: str, write: int = 0, locality: int = 3) -> None:
        self.emit(f"call void @llvm.prefetch.p0(ptr {ptr}, i32 {write}, i32 {locality}, i32 1)")

    def fma(self, x: str, y: str, acc: str) -> str:
        vty = self.vty
        return self(f"call {vty} @llvm.fma.v{self.spec.lanes}f32({vty} {x}, {vty} {y}, "
                    f"{vty} {acc})")

    # The kernel.

    def k_loops(self) -> list[list[str]]:
        """Unrolled main loop plus a remainder loop (none when rolled), accumulators carried in
        phis (registers); the main loop's `sets` are summed before the remainder."""
        spec = self.spec
        tile = spec.mr * spec.nv
        flat = ["zeroinitializer"] * (tile * spec.sets)
        if spec.unroll == 1:
            loops = [("main", 0, "%kc", 1)]
        else:
            n_main = self(f"mul i64 {self(f'sdiv i64 %kc, {spec.unroll}')}, {spec.unroll}")
            loops = [("main", 0, n_main, spec.unroll), ("rest", n_main, "%kc", 1)]
        a, b, pre = "%a", "%b", "entry"
        for label, start, stop, unroll in loops:
            self.emit(f"br label %{label}.head")
            self.label(f"{label}.head")
            phis_at = len(self.lines)
            self.lines.append("")  # the phis, once the body has made their incoming values
            k, pa, pb = f"%{label}.k", f"%{label}.a", f"%{label}.b"
            phis = [f"%{label}.acc{j}" for j in range(len(flat))]
            self.emit(f"%{label}.go = icmp slt i64 {k}, {stop}")
            self.emit(f"br i1 %{label}.go, label %{label}.body, label %{label}.done")
            self.label(f"{label}.body")
            if spec.a_direct and label == "main":
                self.prefetch_next(k)
            stream = self.prefetch_stream() if label == "main" and spec.stream else []
            cur = [[phis[t + i * spec.nv:t + (i + 1) * spec.nv] for i in range(spec.mr)]
                   for t in range(0, len(flat), tile)]
            cur, a_next, b_next = self.steps(cur, pa, pb, unroll)
            self.emit(f"{k}.next = add i64 {k}, {unroll}")
            self.emit(f"br label %{label}.head")
            body = f"%{label}.body"
            incoming = [f"{k} = phi i64 [{start}, %{pre}], [{k}.next, {body}]",
                        f"{pa} = phi ptr [{a}, %{pre}], [{a_next}, {body}]",
                        f"{pb} = phi ptr [{b}, %{pre}], [{b_next}, {body}]"]
            incoming += stream
            new = (x for group in cur for r in group for x in r)
            incoming += [f"{phi} = phi {self.vty} [{init}, %{pre}], [{x}, {body}]"
                         for phi, init, x in zip(phis, flat, new, strict=True)]
            self.lines[phis_at] = "\n".join("  " + line for line in incoming)
            self.label(f"{label}.done")
            flat, a, b, pre = phis, pa, pb, f"{label}.done"
            while len(flat) > tile:  # the sets, summed
                flat = [self(f"fadd {self.vty} {x}, {y}")
                        for x, y in zip(flat[:tile], flat[tile:2 * tile], strict=True)
                        ] + flat[2 * tile:]
        return [flat[i * spec.nv:(i + 1) * spec.nv] for i in range(spec.mr)]

    def prefetch_next(self, k: str) -> None:
        """Direct A: stream in the next tile down (mr rows on) while this one computes, the
        lines this step's k range covers in a packed order; exact when its rows are adjacent
        (lda = kc), merely early or wasted otherwise (prefetches never fault)."""
        spec = self.spec
        at = self(f"mul i64 {k}, {spec.mr}")
        for line in range(-(-spec.mr * spec.unroll * 4 // 64)):
            offset = self(f"add i64 {at}, {line * 16}") if line else at
            self.prefetch(self.gep(self.next_tile, offset), locality=2)

    def prefetch_stream(self) -> list[str]:
        """One line of the caller's prefetch stream per main-loop iteration: `%pf`, then
        `%pfstep` bytes on for each of the `%pfn` lines (the last repeated once they are done;
        `%pfn` 0 repeats `%pf`). The driver points it at what a later tile reads from beyond
        L2 (the next B panel), so that load overlaps this tile's FMAs. Returns the phis.
        Only `spec.stream` variants have one (see `MicroKernel.streams`)."""
        self.prefetch("%pf.at", locality=2)
        self.emit("%pf.more = icmp sgt i64 %pf.left, 1")
        self.emit("%pf.step = select i1 %pf.more, i64 %pfstep, i64 0")
        self.emit("%pf.at.next = getelementptr i8, ptr %pf.at, i64 %pf.step")
        self.emit("%pf.left.next = sub i64 %pf.left, 1")
        return ["%pf.at = phi ptr [%pf, %entry], [%pf.at.next, %main.body]",
                "%pf.left = phi i64 [%pfn, %entry], [%pf.left.next, %main.body]"]

    def steps(self, sets, a, b, unroll):
        """`unroll` k steps from A at `a` and B at `b`: per step nv loads of B, mr broadcasts of
        A, mr*nv FMAs into accumulator set j % len(sets). Returns the sets and where A and B
        continue."""
        spec = self.spec
        if spec.a_direct:  # row i at base + (i % group) * lda, the base stepping a group on
            group = min(spec.mr, _ROW_GROUP)
            offsets = [0] + [self(f"mul i64 %lda, {i}")
                             for i in range(1, group + (spec.mr > group))]
            bases = [a]
            for _ in range((spec.mr - 1) // group):
                bases.append(self.gep(bases[-1], offsets[group]))
            at = [(self.gep(bases[i // group], offsets[i % group]), 0) for i in range(spec.mr)]
            a_step = 1
        else:
            at = [(a, i) for i in range(spec.mr)]
            a_step = spec.mr
        sets = list(sets)
        for j in range(unroll):
            accs = sets[j % len(sets)]
            bv = [self.load_b(self.gep(b, v * spec.lanes), v) for v in range(spec.nv)]
            if spec.b_prefetch:
                ahead = self.gep(b, self.b_ahead)
                for v in range(spec.nv):
                    self.prefetch(self.gep(ahead, v * spec.lanes))
            out = []
            for i in range(spec.mr):
                base, offset = at[i]
                offset += j * a_step
                if spec.a_lanes > 1:
                    first = i - i % spec.a_lanes
                    if i == first:
                        n = min(spec.a_lanes, spec.mr - first)
                        chunk = self(f"load <{n} x float>, ptr {self.gep(base, offset)}, "
                                     "align 4")
                    lane = i % spec.a_lanes
                    av = self(f"shufflevector <{n} x float> {chunk}, <{n} x float> undef, "
                              f"<{n} x i32> <{', '.join([f'i32 {lane}'] * n)}>")
                    if n != spec.lanes:
                        av = self(f"shufflevector <{n} x float> {av}, <{n} x float> undef, "
                                  f"<{spec.lanes} x i32> zeroinitializer")
                else:
                    x = self(f"load float, ptr {self.gep(base, offset)}, align 4")
                    av = self.splat("float", x)
                out.append([self.fma(av, bv[v], accs[i][v]) for v in range(spec.nv)])
            sets[j % len(sets)] = out
            b = self(f"getelementptr inbounds i8, ptr {b}, i64 {self.b_step}")
        return sets, self.gep(a, unroll * a_step), b

    def load_b(self, ptr: str, v: int) -> str:
        if self.spec.nv_dynamic and v > 0:
            return self.masked_load(ptr, self.masks[v])
        return self.load(ptr)

    def epilogue(self, accs) -> None:
        """Write the tile. A full-width tile (nearly every one) uses plain loads and stores,
        reading C only when beta is set: AVX2's masked moves cost several times a plain one
        on Zen (a masked store is microcoded), which a K = 64 tile felt as a fifth of its time.
        Narrower tiles go through masks: C is read through one that is empty when beta=0 (so
        garbage in C never leaks), and columns past `ncols` are neither read nor written:
        `masks[v]` guards vector v where it may be partial (the last one; any with
        `nv_dynamic`)."""
        spec = self.spec
        self.emit(f"%is.full = icmp eq i64 %ncols, {spec.nv * spec.lanes}")
        self.emit("br i1 %is.full, label %full, label %edge")
        self.label("full")
        self.emit("%beta.set = icmp ne i32 %beta, 0")
        self.emit("br i1 %beta.set, label %full.add, label %full.set")
        for label in ("full.add", "full.set"):
            self.label(label)
            for i, ptr, v in self._tile_vectors():
                val = accs[i][v]
                if label == "full.add":
                    val = self(f"fadd {self.vty} {val}, {self.load(ptr)}")
                self.emit(f"store {self.vty} {val}, ptr {ptr}, align 4")
            self.emit("ret void")
        self.label("edge")
        keep = self.splat("i1", self("icmp ne i32 %beta, 0"))
        for i, ptr, v in self._tile_vectors():
            mask = self.masks.get(v)
            if mask is not None:
                old = self.masked_load(ptr, self(f"and <{spec.lanes} x i1> {mask}, {keep}"))
            else:
                old = self.masked_load(ptr, keep)
            val = self(f"fadd {self.vty} {accs[i][v]}, {old}")
            if mask is not None:
                self.masked_store(val, ptr, mask)
            else:
                self.emit(f"store {self.vty} {val}, ptr {ptr}, align 4")
        self.emit("ret void")

    def _tile_vectors(self):
        """(row, address, vector index) of each vector of the C tile, row by row."""
        spec = self.spec
        for i in range(spec.mr):
            row = self.gep("%c", self.row(i, "%ldc"))
            for v in range(spec.nv):
                yield i, self.gep(row, v * spec.lanes), v
