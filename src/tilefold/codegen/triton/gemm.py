"""The Triton GEMM template: a `GemmSpec` -> the source of a `@triton.jit` (batched) GEMM with its
weight-dequantizing prologue and fused epilogue, plus the split-K reduce kernel.

`tf_gemm` computes one BLOCK_M x BLOCK_N tile of C[b] = A[b] @ B[b] per program:

- program ids are swizzled so GROUP_M consecutive row blocks walk the same columns of B while
  they are in L2; axis 1 of the grid is the (flattened) batch from entry BATCH0 on (a batch
  beyond the 65,535 programs CUDA allows along axis 1 is launched in chunks), axis 2 the K
  split;
- every operand is addressed by its strides, so a transposed A or B is a strided view and a
  broadcast batch a zero batch stride; K tails are masked (loads give 0), and rows and
  columns past M and N wrap around to the first ones, which the masked stores never write;
- the dot accumulates in f32 (`input_precision="ieee"` for f32 operands: no TF32 rounding);
  fp8 e4m3 operands are loaded as fp8 and go to the matrix units as they are (only the
  interpreter, which cannot fill masked lanes of an fp8 load, gets their bytes and bitcasts
  them); an fp8 x fp8 dot's accumulation is explicit: precise (`fp8_fast_accum=False`, the
  default, as `torch._scaled_mm`'s) promotes the matrix units' partial sums into the f32
  accumulator after every K block (`max_num_imprecise_acc=BLOCK_K`), fast lets them
  accumulate in the units' reduced precision over the whole K loop (Triton's sm_90 default);
- quantized weights (`b` = "i8"/"u8": one int8 code an element, "i4": two int4 codes a byte
  along K, the even k in the low nibble, as `tilefold.quant` packs them, "fp8e4m3" under an
  f32/f16/bf16 A: fp8 codes) are dequantized per tile, (code - zero[k // QGROUP, n]) *
  scale[k // QGROUP, n] with the zero point only when given, to A's dtype before the dot;
- the epilogue is a row program (`codegen/rowprog/program.py`) over C's rows, lowered from the
  graph IR by the same table as every other kernel: each operand's role (a full tile, one row
  shared by all rows, one value per row, a scalar) comes from its `Source`, which the IR's axis
  classes decided, never from comparing shapes; its primitives are `codegen/triton/math.py`'s
  forms.

Split-K: "workspace" writes each split's f32 partial tile to a [SPLIT_K, batch, M, N] buffer
and `tf_gemm_reduce` sums the splits, then runs the epilogue and stores; "atomic" adds each
partial into a zeroed f32 C with `tl.atomic_add` (no epilogue: it would see partial sums).

The persistent TMA variant (`tma` = "kn" or "nk", sm_90): a fixed grid of programs, each
stepping over the output tiles of every batch entry (tile t is batch entry t // tiles, then the
same swizzle), A and B read through tensor descriptors that `tl.make_tensor_descriptor` builds
once per program ([batch, M, K] for A; [batch, K, N] for a row-major B, "kn", or [batch, N, K]
for one stored transposed, "nk", as a torch linear weight is), so the tensor memory accelerator
copies each tile and the descriptor's bounds give zeros past M, N and K (no masks, no wrap
around); a broadcast operand's descriptor has one batch entry. The epilogue and the stores are
the same as the other variant's. Compiled, the tile loop is a `tl.range(..., flatten=True)`,
which lets Triton pipeline the next tile's copies under this one's epilogue.

Triton 3.6's interpreter cannot `range` over a run-time bound, so `pipelined=False` writes the
K loop (and the tile loop) as a `while` loop (for TRITON_INTERPRET=1); compiled code gets a
`range` loop, the form Triton software-pipelines over `num_stages` buffers. Both loops run the
same body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tilefold.codegen.rowprog.program import IDENTITY, Program
from tilefold.codegen.triton.emit import literal, triton_module
from tilefold.codegen.triton.math import PRIMITIVE_FORMS
from tilefold.errors import UnsupportedError

DOT_DTYPES = ("f32", "f16", "bf16", "fp8e4m3")
QUANTIZED = ("i8", "u8", "i4")  # B's weight codes besides fp8 ones (a fp8 B with a non-fp8 A)
SPLITS = ("none", "workspace", "atomic")
TMA_ORDERS = ("kn", "nk")  # B's memory order under the persistent TMA variant
ROUND = {"bf16": "_tf_round_bf16({0})", "f16": "{0}.to(tl.float16).to(tl.float32)"}
KERNEL, REDUCE = "tf_gemm", "tf_gemm_reduce"
# the persistent variant's batch size, each operand's descriptor batch (1 when broadcast) and
# its program count (the tile loop's step)
TMA_PARAMS = ["BATCH", "A_BATCH", "B_BATCH", "PROGRAMS"]


@dataclass(frozen=True, eq=False)
class GemmSpec:
    """What one generated GEMM computes.

    `a`: the dtype the dot reads from A; `b`: B's, or "i8"/"u8"/"i4" (or "fp8e4m3" under a
    wider A) for quantized weights with f32 group scales, dequantized to `a`, and zero points
    when `zero_point`. `epilogue`: a row program over C's rows whose source
    argument 0 is C; `stores`: what each output holds (None: C itself, else a program value).
    `c_round`: "bf16"/"f16" when the matmul's result has that dtype, so C is rounded before
    the epilogue reads it, as the graph IR rounds each op's result. `tma`: None for one
    program a tile with pointer loads, else the persistent TMA variant with B's memory order
    ("kn": rows along K, "nk": rows along N); A's rows run along K either way.
    `fp8_fast_accum`: an fp8 x fp8 dot accumulates in the matrix units' fast mode (see the
    header); precise otherwise.
    """

    a: str
    b: str
    epilogue: Program | None = None
    stores: tuple[int | None, ...] = (None,)
    c_round: str | None = None
    split: str = "none"
    pipelined: bool = True
    zero_point: bool = False
    tma: str | None = None
    fp8_fast_accum: bool = False
    inputs: tuple[int, ...] = field(init=False)  # epilogue argument numbers the kernel reads

    @property
    def dequantizes(self) -> bool:
        """Whether B holds weight codes the kernel dequantizes with scales."""
        return self.b in QUANTIZED or self.b != self.a

    def __post_init__(self) -> None:
        op = f"Triton GEMM ({self.a} x {self.b})"
        if self.a not in DOT_DTYPES:
            raise UnsupportedError(f"{op}: A must be one of {', '.join(DOT_DTYPES)}")
        if self.b not in (*DOT_DTYPES, *QUANTIZED):
            raise UnsupportedError(f"{op}: B must be one of {', '.join(DOT_DTYPES)}, or "
                                   "i8/u8/i4 quantized weights")
        if self.dequantizes and self.a == "fp8e4m3":
            raise UnsupportedError(f"{op}: quantized weights dequantize to an f32/f16/bf16 A")
        if self.dequantizes and self.b not in (*QUANTIZED, "fp8e4m3"):
            raise UnsupportedError(f"{op}: A and B must have one dtype; cast one operand first")
        if self.zero_point and self.b not in QUANTIZED:
            raise UnsupportedError(f"{op}: zero points shift integer codes; {self.b} B has none")
        if self.split not in SPLITS:
            raise UnsupportedError(f"{op}: split is one of {', '.join(SPLITS)}, not "
                                   f"{self.split!r}")
        if self.split == "atomic" and (self.epilogue is not None or self.stores != (None,)):
            raise UnsupportedError(f"{op}: atomic split-K adds partial sums into C, so an "
                                   "epilogue would see them; use split='workspace'")
        if self.tma is not None and self.tma not in TMA_ORDERS:
            raise UnsupportedError(f"{op}: tma is B's memory order, one of "
                                   f"{', '.join(TMA_ORDERS)}, not {self.tma!r}")
        if self.tma is not None and (self.dequantizes or self.split != "none"):
            raise UnsupportedError(f"{op}: the persistent TMA variant copies A and B as they "
                                   "are, with no K split; dequantized weights and split-K run "
                                   "on the pointer variant (tma=None)")
        if self.fp8_fast_accum and (self.a, self.b) != ("fp8e4m3", "fp8e4m3"):
            raise UnsupportedError(f"{op}: fast accumulation is a mode of fp8 x fp8 dots")
        if self.c_round is not None and self.c_round not in ROUND:
            raise UnsupportedError(f"{op}: C rounds to bf16 or f16, not {self.c_round}")
        prog = self.epilogue
        if prog is None and any(s is not None for s in self.stores):
            raise UnsupportedError(f"{op}: a store names a program value but there is no "
                                   "epilogue")
        reductions = sorted({p.op for p in prog.prims.values() if p.op in IDENTITY}) \
            if prog else []
        if reductions:
            raise UnsupportedError(f"{op}: the epilogue reduces along C's rows "
                                   f"({', '.join(reductions)}), which a tile of columns cannot "
                                   "finish; run the row reduction as its own kernel")
        missing = sorted({p.op for p in prog.prims.values()
                          if p.op != "const" and p.op not in PRIMITIVE_FORMS}) if prog else []
        if missing:
            raise UnsupportedError(f"{op}: the epilogue needs {', '.join(missing)}, which the "
                                   "Triton backend has no form for yet")
        args = sorted({s.arg for s in prog.sources.values()} - {0}) if prog else []
        object.__setattr__(self, "inputs", tuple(args))


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1

    def __call__(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)


def _epilogue(out: _Lines, spec: GemmSpec) -> dict[int | None, str]:
    """Lines computing the epilogue over the f32 tile `acc`; the local of each stored value.

    Expects `rows` (C's row r = batch * M + m, int64, [BLOCK_M, 1]), `rn`, `m_mask`,
    `n_mask`, `tile_mask` and the pointers `e<arg>_ptr` of the program's inputs."""
    c = "acc"
    if spec.c_round is not None:
        out(f"c = {ROUND[spec.c_round].format('acc')}")
        c = "c"
    names: dict[int | None, str] = {None: c}
    prog = spec.epilogue
    if prog is None:
        return names
    for vid, src in sorted(prog.sources.items()):
        if src.arg == 0:
            names[vid] = c
            continue
        row = "rows" if src.div == 1 else f"(rows // {src.div})"
        row = f"({row} % {src.mod})" if src.mod else row
        terms = ([f"{row} * {src.stride}"] if src.stride else []) + \
            (["rn[None, :]"] if src.vec else [])
        mask = {(True, True): "tile_mask", (True, False): "m_mask",
                (False, True): "n_mask"}.get((bool(src.stride), src.vec))
        ptr = f"e{src.arg}_ptr" + "".join(f" + {t}" for t in terms)
        load = f"tl.load({ptr})" if mask is None else f"tl.load({ptr}, mask={mask}, other=0)"
        out(f"v{vid} = {load}.to(tl.float32)")
        names[vid] = f"v{vid}"
    for vid, prim in sorted(prog.prims.items()):
        if prim.op == "const":
            text = literal(prim.const)
        else:
            text = PRIMITIVE_FORMS[prim.op].format(*(names[a] for a in prim.args))
        out(f"v{vid} = {text}")
        names[vid] = f"v{vid}"
    return names


def _store(out: _Lines, spec: GemmSpec, names: dict[int | None, str]) -> None:
    out("c_off = pid_b * so_b + rm.to(tl.int64)[:, None] * so_m + rn[None, :] * so_n")
    for j, value in enumerate(spec.stores):
        v = names[value]
        if value is not None and spec.epilogue is not None and \
                not spec.epilogue.vec.get(value, True):
            v = f"({v} + tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32))"  # a row value: widen
        out(f"tl.store(o{j}_ptr + c_off, {v}.to(o{j}_ptr.dtype.element_ty), mask=tile_mask)")


def _tile(out: _Lines) -> None:
    out("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    out("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    out("m_mask = rm[:, None] < M")
    out("n_mask = rn[None, :] < N")
    out("tile_mask = m_mask & n_mask")
    out("rows = pid_b * M + rm[:, None]  # C's row in the [batch * M, N] space of the epilogue")


def _operand_loads(out: _Lines, spec: GemmSpec) -> None:
    out("k_mask = rk < K")
    # compiled, fp8 loads as fp8; the interpreter (which cannot fill masked lanes of an fp8
    # load) gets its bytes and bitcasts them
    fp8 = "" if spec.pipelined else ".to(tl.float8e4nv, bitcast=True)"
    out(f"a = tl.load(a_ptrs, mask=k_mask[None, :], other=0.0)"
        f"{fp8 * (spec.a == 'fp8e4m3')}")
    b_mask = "mask=k_mask[:, None], other=0"
    if not spec.dequantizes:
        out(f"b = tl.load(b_ptrs, {b_mask}.0){fp8 * (spec.b == 'fp8e4m3')}")
        return
    if spec.b == "i4":  # two codes a byte along K: k even in the low nibble; sign-extend
        out(f"byte = tl.load(b_ptrs, {b_mask}).to(tl.int32)")
        out("q = ((((byte >> ((rk[:, None] % 2) * 4)) & 15) ^ 8) - 8).to(tl.float32)")
    else:
        other = ".0" if spec.b == "fp8e4m3" else ""
        out(f"q = tl.load(b_ptrs, {b_mask}{other}){fp8 * (spec.b == 'fp8e4m3')}"
            ".to(tl.float32)")
    group = "(rk[:, None] // QGROUP)"
    if spec.zero_point:
        out(f"q -= tl.load(z_base + {group} * sz_g, {b_mask}).to(tl.float32)")
    out(f"sc = tl.load(s_base + {group} * ss_g, {b_mask})")
    out("b = (q * sc).to(a.dtype)")


def _advance(out: _Lines, spec: GemmSpec) -> None:
    """Step the operand pointers and K indices to the next K block."""
    out("a_ptrs += BLOCK_K * sa_k")
    if spec.b == "i4":  # a byte holds two rows of K: the next block starts BLOCK_K / 2 on
        out("b_ptrs += (BLOCK_K // 2) * sb_k")
    else:
        out("b_ptrs += BLOCK_K * sb_k")
    out("rk += BLOCK_K")


def main_params(spec: GemmSpec) -> list[str]:
    """`tf_gemm`'s run-time parameters, in order (strides in elements)."""
    quant, zp = spec.dequantizes, spec.zero_point
    outs = ["w_ptr"] if spec.split == "workspace" else \
        [f"o{j}_ptr" for j in range(len(spec.stores))]
    return ["a_ptr", "b_ptr", *(["s_ptr"] if quant else []), *(["z_ptr"] if zp else []),
            *([] if spec.split == "workspace" else [f"e{a}_ptr" for a in spec.inputs]),
            *outs, "M", "N", "K", "K_ITERS", *(["QGROUP"] if quant else []),
            "sa_b", "sa_m", "sa_k", "sb_b", "sb_k", "sb_n",
            *(["ss_b", "ss_g", "ss_n"] if quant else []),
            *(["sz_b", "sz_g", "sz_n"] if zp else []), "so_s", "so_b", "so_m", "so_n",
            *(TMA_PARAMS if spec.tma else ["BATCH0"])]


def reduce_params(spec: GemmSpec) -> list[str]:
    """`tf_gemm_reduce`'s run-time parameters, in order."""
    return ["w_ptr", *(f"e{a}_ptr" for a in spec.inputs),
            *(f"o{j}_ptr" for j in range(len(spec.stores))), "M", "N",
            "sw_s", "sw_b", "sw_m", "sw_n", "so_b", "so_m", "so_n", "BATCH0"]


def _loop(out: _Lines, spec: GemmSpec, var: str, start: str, stop: str, step: str = "1",
          flatten: bool = False) -> Callable[[], None]:
    """Open a loop of `var` from `start` below `stop` by `step`: a `range` loop when
    pipelined (`tl.range` with `flatten` to pipeline across an outer loop), a `while` loop
    for the interpreter; returns what closes it."""
    if not spec.pipelined:  # Triton 3.6's interpreter cannot range() over a run-time bound
        out(f"{var} = {start}")
        out(f"while {var} < {stop}:")
    elif flatten:
        out(f"for {var} in tl.range({start}, {stop}, {step}, flatten=True):")
    else:
        out(f"for {var} in range({start}, {stop}{'' if step == '1' else ', ' + step}):")
    out.depth += 1

    def close() -> None:
        if not spec.pipelined:
            out(f"{var} += {step}")
        out.depth -= 1

    return close


def _swizzle(out: _Lines) -> None:
    """`pid_m`, `pid_n` of tile `pid` (of blocks_m x blocks_n)."""
    out("# swizzle: GROUP_M row blocks in a row walk the same columns of B (kept in L2)")
    out("in_group = GROUP_M * blocks_n")
    out("first_m = (pid // in_group) * GROUP_M")
    out("group_rows = tl.minimum(blocks_m - first_m, GROUP_M)")
    out("pid_m = first_m + (pid % in_group) % group_rows")
    out("pid_n = (pid % in_group) // group_rows")


def _finish(out: _Lines, spec: GemmSpec) -> None:
    """The f32 tile `acc` to memory: a split's partial, an atomic add, or the epilogue."""
    if spec.split == "workspace":
        out("w_off = (pid_k * so_s + pid_b * so_b + rm.to(tl.int64)[:, None] * so_m"
            " + rn[None, :] * so_n)")
        out("tl.store(w_ptr + w_off, acc, mask=tile_mask)")
    elif spec.split == "atomic":
        out("c_off = pid_b * so_b + rm.to(tl.int64)[:, None] * so_m + rn[None, :] * so_n")
        out("tl.atomic_add(o0_ptr + c_off, acc, mask=tile_mask)")
    else:
        _store(out, spec, _epilogue(out, spec))


def dot_options(spec: GemmSpec) -> str:
    """The keyword arguments of the template's `tl.dot`: IEEE products for f32 (no TF32), the
    accumulation mode of an fp8 x fp8 dot (see the header)."""
    if spec.a == "f32":
        return ', input_precision="ieee"'
    if (spec.a, spec.b) == ("fp8e4m3", "fp8e4m3") and not spec.fp8_fast_accum:
        return ", max_num_imprecise_acc=BLOCK_K"
    return ""


def _dot(out: _Lines, spec: GemmSpec) -> None:
    out(f"acc = tl.dot(a, b, acc{dot_options(spec)})")


def _pointer_body(out: _Lines, spec: GemmSpec) -> None:
    """One program a tile (and K split), operands loaded through pointers."""
    quant = spec.dequantizes
    out("pid = tl.program_id(0)")
    out("pid_b = BATCH0 + tl.program_id(1).to(tl.int64)  # launched in chunks of <= 65,535")
    out("pid_k = tl.program_id(2)")
    out("blocks_m = (M + BLOCK_M - 1) // BLOCK_M")
    out("blocks_n = (N + BLOCK_N - 1) // BLOCK_N")
    _swizzle(out)
    _tile(out)
    out("# rows and columns past M and N wrap around to the first ones (never stored), so")
    out("# only K is masked in the loop")
    out("a_base = a_ptr + pid_b * sa_b + (rm % M).to(tl.int64)[:, None] * sa_m")
    out("b_base = b_ptr + pid_b * sb_b + (rn % N).to(tl.int64)[None, :] * sb_n")
    if quant:
        out("s_base = s_ptr + pid_b * ss_b + (rn % N)[None, :] * ss_n")
    if spec.zero_point:
        out("z_base = z_ptr + pid_b * sz_b + (rn % N)[None, :] * sz_n")
    out("acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)")
    out("rk = pid_k * K_ITERS * BLOCK_K + tl.arange(0, BLOCK_K)  # this split's first K block")
    out("a_ptrs = a_base + rk.to(tl.int64)[None, :] * sa_k  # offsets past 2**31 stay exact")
    b_rows = "(rk.to(tl.int64)[:, None] // 2)" if spec.b == "i4" else "rk.to(tl.int64)[:, None]"
    out(f"b_ptrs = b_base + {b_rows} * sb_k")
    close = _loop(out, spec, "i", "0", "K_ITERS")
    _operand_loads(out, spec)
    _dot(out, spec)
    _advance(out, spec)
    close()
    _finish(out, spec)


def _tma_body(out: _Lines, spec: GemmSpec) -> None:
    """The persistent variant: PROGRAMS programs step over every tile of every batch entry,
    A and B tiles copied through tensor descriptors whose bounds zero what lies past them."""
    out("blocks_m = (M + BLOCK_M - 1) // BLOCK_M")
    out("blocks_n = (N + BLOCK_N - 1) // BLOCK_N")
    out("tiles = blocks_m * blocks_n")
    out("a_desc = tl.make_tensor_descriptor(a_ptr, [A_BATCH, M, K], [sa_b, sa_m, 1], "
        "[1, BLOCK_M, BLOCK_K])")
    b_dims, b_block = ("K, N", "BLOCK_K, BLOCK_N") if spec.tma == "kn" else \
        ("N, K", "BLOCK_N, BLOCK_K")
    b_stride = "sb_k" if spec.tma == "kn" else "sb_n"
    out(f"b_desc = tl.make_tensor_descriptor(b_ptr, [B_BATCH, {b_dims}], [sb_b, {b_stride}, 1], "
        f"[1, {b_block}])")
    close_tiles = _loop(out, spec, "tile", "tl.program_id(0)", "tiles * BATCH", "PROGRAMS",
                        flatten=True)
    out("bat = tile // tiles  # this tile's batch entry")
    out("pid_b = bat.to(tl.int64)")
    out("pid = tile % tiles")
    _swizzle(out)
    _tile(out)
    out("acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)")
    close_k = _loop(out, spec, "kk", "0", "K_ITERS")
    out("a = a_desc.load([bat % A_BATCH, pid_m * BLOCK_M, kk * BLOCK_K])"
        ".reshape(BLOCK_M, BLOCK_K)")
    if spec.tma == "kn":
        out("b = b_desc.load([bat % B_BATCH, kk * BLOCK_K, pid_n * BLOCK_N])"
            ".reshape(BLOCK_K, BLOCK_N)")
    else:
        out("b = b_desc.load([bat % B_BATCH, pid_n * BLOCK_N, kk * BLOCK_K])"
            ".reshape(BLOCK_N, BLOCK_K).T")
    _dot(out, spec)
    close_k()
    _finish(out, spec)
    close_tiles()


def _main_kernel(spec: GemmSpec) -> list[str]:
    out = _Lines()
    (_pointer_body if spec.tma is None else _tma_body)(out, spec)
    return _function(KERNEL, main_params(spec), ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"),
                     out.lines)


def _reduce_kernel(spec: GemmSpec) -> list[str]:
    out = _Lines()
    out("pid = tl.program_id(0)")
    out("pid_b = BATCH0 + tl.program_id(1).to(tl.int64)")
    out("blocks_n = (N + BLOCK_N - 1) // BLOCK_N")
    out("pid_m = pid // blocks_n")
    out("pid_n = pid % blocks_n")
    _tile(out)
    out("w_off = pid_b * sw_b + rm.to(tl.int64)[:, None] * sw_m + rn[None, :] * sw_n")
    out("acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)")
    out("for s in tl.static_range(SPLIT_K):")
    out("    acc += tl.load(w_ptr + s * sw_s + w_off, mask=tile_mask, other=0.0)")
    _store(out, spec, _epilogue(out, spec))
    return _function(REDUCE, reduce_params(spec), ("BLOCK_M", "BLOCK_N", "SPLIT_K"), out.lines)


def _function(name: str, params: list[str], constexprs: tuple[str, ...],
              body: list[str]) -> list[str]:
    return ["@triton.jit", f"def {name}(", *(f"    {p}," for p in params),
            *(f"    {c}: tl.constexpr," for c in constexprs), "):", *body, ""]


def emit_gemm(spec: GemmSpec) -> str:
    """The Python source of a module defining `tf_gemm` (and `tf_gemm_reduce` for the
    workspace split-K) for `spec`."""
    body = _main_kernel(spec)
    if spec.split == "workspace":
        body += _reduce_kernel(spec)
    variant = "pointer loads" if spec.tma is None else f"persistent TMA, B {spec.tma}"
    fp8 = f", fp8 {'fast' if spec.fp8_fast_accum else 'precise'} accumulation" \
        if (spec.a, spec.b) == ("fp8e4m3", "fp8e4m3") else ""
    note = (f"# A {spec.a}, B {spec.b}{fp8}, {variant}, split-K {spec.split}, epilogue "
            f"{'none' if spec.epilogue is None else len(spec.epilogue.prims)} primitive(s)")
    return triton_module("Triton GEMM generated by tilefold's template (codegen/triton/gemm.py).",
                         body, [note])


def signature(spec: GemmSpec, kernel: str, pointers: dict[str, str]) -> dict[str, str]:
    """Triton's type of every run-time parameter of `kernel` (for `triton.compile` without a
    GPU): `pointers` maps pointer parameters ("a_ptr", "o0_ptr", "e1_ptr", ...) to types such
    as "*bf16"; the others are "*fp32", integers "i32"."""
    params = main_params(spec) if kernel == KERNEL else reduce_params(spec)
    return {p: pointers.get(p, "*fp32" if p.endswith("_ptr") else "i32") for p in params}


__all__ = ["TMA_ORDERS", "TMA_PARAMS", "GemmSpec", "dot_options", "emit_gemm", "main_params",
           "reduce_params", "signature"]
