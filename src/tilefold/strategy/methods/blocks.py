"""Building blocks: the BLIS-shaped GEMM (hand-written micro-kernels) with a generated epilogue.

Prologues become strided views (transposes) or broadcast batch dims the GEMM reads in place; a
constant B is packed once. The epilogue (bias, activation, residual, scaling, row softmax or
norms) is a row program run over C right after the GEMM, while C is still in cache. The GEMM
has no in-register epilogue hook yet, so C makes one extra trip through the caches.

f32 operands run the f32 GEMM (`codegen/llvm/gemm`); bf16 x bf16, f16 x f16, u8 x i8 and i8 x i8
run the low-precision GEMM through `quant.api.matmul_lowp` (a constant B packed once with
`prepack_lowp`): its f32 or i32 sums are C's scratch, which the row program reads (a bf16/f16 C
rounded as it is loaded) to write the group's outputs in their own dtypes; a bf16/f16 matmul
with no epilogue still runs a row program, the one rounding of the f32 sums to C's dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import weakref
from collections.abc import Callable

import numpy as np

from tilefold.codegen.kernel.schedule import vector_lanes
from tilefold.codegen.llvm.cpu.rowkernel import generated_row_kernel
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.vecmath import MATH_VECTORS
from tilefold.errors import TilefoldError
from tilefold.ir import Operation, Value, dims
from tilefold.ir.types import SymDim
from tilefold.passes.fusion_policy import CPU_FUSION  # its free prologues are views
from tilefold.quant.formats import WEIGHT_ACTIVATIONS
from tilefold.runtime import num_threads, source_digest
from tilefold.runtime.buffers import release_pages
from tilefold.runtime.replay import NativeCall
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem
from tilefold.target import Target, measured_peak_gflops

GEMM_EFFICIENCY = 0.8  # of the measured peak of the GEMM's dtype, f32 and low precision alike
# The low-precision GEMM's operand pairs and the peak probe (`target/peaks.py`) of its rate:
# "bf16" falls back to the f32 FMA where bf16 is widened; f16 has no probe, and runs at most
# at the f32 rate on the hosts tilefold has kernels for; AMX tiles are not counted (the
# estimate is low there, which only ranks blocks.gemm below a faster candidate it beats).
LOWP_PEAKS = {("bf16", "bf16"): "bf16", ("f16", "f16"): "f32", ("u8", "i8"): "int8",
              ("i8", "i8"): "int8"}


def _view(op: Operation, problem: Problem):
    attrs = problem.attrs(op)
    if op.name == "transpose":
        return lambda x: np.transpose(x, attrs["perm"])
    if op.name == "expand_dims":
        return lambda x: np.expand_dims(x, tuple(attrs["axes"]))
    return lambda x: np.broadcast_to(x, attrs["shape"])


@register_method
class GemmEpilogue(Method):
    name = "blocks.gemm"
    family = "building-blocks"
    generators = ("tilefold.codegen.gemm", "tilefold.codegen.llvm.gemm",
                  "tilefold.codegen.llvm.cpu", "tilefold.codegen.rowprog", "tilefold.codegen.llvm",
                  "tilefold.codegen.lower", "tilefold.codegen.llvm.lowp", "tilefold.quant")

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        # On first use: `import tilefold` does not load the row-program generator.
        from tilefold.codegen.llvm.rowprog import Emitter
        from tilefold.codegen.rowprog import NotARowProgram, build_program

        matmuls = [op for op in problem.body if op.name == "matmul"]
        if len(matmuls) != 1:
            return "needs exactly one matmul in the group"
        mm = matmuls[0]
        pair = tuple(str(problem.types[v].dtype) for v in mm.operands)
        lowp = pair != ("f32", "f32")
        if lowp:
            refusal = _lowp_refusal(problem, mm, ctx.target)
            if refusal:
                return refusal
        at = problem.body.index(mm)
        prologue, epilogue = problem.body[:at], problem.body[at + 1:]
        deq = _weight_only(problem, mm, prologue)
        if isinstance(deq, str):
            return deq
        views = CPU_FUSION.free_prologues
        bad = [op.name for op in prologue if op.name not in views and op is not deq]
        if bad:
            return (f"prologue {', '.join(bad)} needs a packing-time conversion hook in the "
                    "GEMM (not available)")
        a_shape, b_shape = (problem.shape(v) for v in mm.operands)
        if not epilogue and not lowp and len(a_shape) == 2 and len(b_shape) == 1:
            return "a lone matrix @ vector product is the LTO library's GEMV"
        c = mm.results[0]
        rounded = str(problem.types[c].dtype) in ("bf16", "f16")  # C's f32 sums, rounded
        epi = None
        if epilogue or rounded:
            ins = [c, *dict.fromkeys(v for op in epilogue for v in op.operands
                                     if v in problem.inputs)]
            outs = [v for v in problem.outputs if v is not c or rounded]
            try:
                epi = (build_program(problem.types, problem.constants, list(epilogue), ins,
                                     outs, c, {c: "f32"} if rounded else None), ins, outs)
                Emitter(epi[0], _lanes(ctx))  # refuses now what it could not emit at build
            except NotARowProgram as exc:
                return f"epilogue: {exc}"
        w = work(problem)
        c_bytes = 4 * float(np.prod(problem.shape(c)))
        # A constant B is packed once, except for an f32 product with a single row of C: the
        # GEMV reads the weight in place as one sequential stream (through packed panels,
        # SmolLM2's f32 decode GEMVs ran ~2x slower on znver4, and kept a second copy). Where
        # the rows are symbolic and may be one, the graph serves one row too, whose GEMV reads
        # B in place, so a packed copy would hold the weight twice: B is packed per call
        # instead (SmolLM2 f32 peak RSS 1147 -> 795 MB; its 256-token prompt 552 -> 455 tok/s
        # on znver3, still 1.16x llama.cpp's F32). Symbolic rows that are never one (Dynamo's
        # graphs: `Context.min_size` 2) have no GEMV reading B in place: B is packed once, as
        # for static rows (MiniLM's encode flow packed each weight per call: 1.20-1.29x ->
        # 1.31-1.40x eager on a shared znver3, 2 threads).
        gemv = not lowp and int(np.prod(problem.shape(c)[:-1])) == 1
        prepack = mm.operands[1] in problem.constants and len(b_shape) == 2 and not gemv \
            and not _may_be_one_row(mm.operands[0].type.shape[:-1], ctx.min_size)
        machine, nbytes, calls = ctx.machine, w.bytes_fused, 2 if epi else 1
        if lowp:
            machine = dataclasses.replace(machine, gflops=_lowp_gflops(ctx, LOWP_PEAKS[pair]))
            nbytes += _lowp_extra_bytes(problem, mm, prepack, c)
            calls -= not w.gemm_flops  # C empty or zeros: no matmul_lowp call
        estimate = (roofline(w.gemm_flops, nbytes, machine, GEMM_EFFICIENCY)
                    + (roofline(w.flops - w.gemm_flops, 2 * c_bytes, ctx.machine, 0.5)
                       if epi else 0.0) + ctx.machine.call_s * calls)
        config = {"prepack": prepack, "epilogue": bool(epilogue)}
        if lowp:
            config["lowp"] = "x".join(pair)
        note = "epilogue as a row program over C" if epilogue else ""
        if rounded and not epilogue:
            note = f"C rounded to {problem.types[c].dtype} by a row program"
        if deq is not None:
            epi_s = estimate - roofline(w.gemm_flops, nbytes, machine, GEMM_EFFICIENCY)
            return self._weight_only_candidates(problem, ctx, mm, deq, epi, config, epi_s)
        build = build_lowp_gemm if lowp else build_gemm
        return [self.candidate(config, estimate,
                               lambda: build(problem, ctx, mm, prologue, epi, prepack), note)]

    def _weight_only_candidates(self, problem: Problem, ctx: Context, mm: Operation, deq: Operation,
                     epi: tuple | None, config: dict, epi_s: float) -> list[Candidate]:
        """The float-decoding candidate and, where activations may be quantized
        (`WEIGHT_ACTIVATIONS`) and the host has VNNI, the integer-dot one."""
        from tilefold.codegen.llvm.lowp.weight_only import dot_refusal

        layout = _weight_layout(problem, ctx, mm, deq)
        config = {**config, "weights": str(problem.types[deq.operands[0]].dtype)}
        rows = int(np.prod(problem.shape(mm.operands[0])[:-1]))
        out = []
        kinds = [False]
        if os.environ.get(WEIGHT_ACTIVATIONS, "f32") == "int8" and \
                dot_refusal(layout, ctx.target) is None:
            kinds.append(True)
        for dot in kinds:
            estimate = _weight_only_seconds(ctx, layout, rows, dot) + epi_s
            note = ("weight-only: int8 activations (per 32 k) x codes, integer dot product"
                    if dot else "weight-only: codes decoded in registers")
            out.append(self.candidate({**config, "activations": "int8" if dot else "f32"},
                                      estimate,
                                      lambda dot=dot: build_weight_only(problem, ctx, mm, deq,
                                                                        epi, dot), note))
        return out


# Vector instructions per vector of weights (L codes decoded to f32, or the 4L codes of an
# integer dot instruction), by kernel and code width: (decoding, once per pass of rows;
# multiplying, once per row). Fitted to the GEMV's times on znver3 (AVX2, 2 threads, 896 x
# 4864 int4/int8, 1 to 256 rows): without VNNI a row's dot is `pmaddubsw`, `pmaddwd` and an add
# (8-bit codes: the row's sign too, and their magnitudes once a pass); 8-bit codes are stored
# in quads, as the dot takes them.
_OPS = {("float", 4): (2.0, 1.0), ("float", 8): (1.0, 1.0),
        ("vnni", 4): (2.0, 1.0), ("vnni", 8): (2.0, 1.0),
        ("maddubs", 4): (1.0, 3.0), ("maddubs", 8): (1.0, 4.0)}


def _weight_only_seconds(ctx: Context, layout, rows: int, dot: bool) -> float:
    """Estimated seconds of a weight-only GEMM: its vector instructions (at the f32 FMA rate;
    the codes decoded once per pass of rows, `_OPS`) or its stream of codes and scales,
    whichever is slower, and the call; from `GEMM_ROWS` rows (float) the f32 GEMM's time and
    the decoding into its panels (4 bytes written a weight)."""
    from tilefold.codegen.llvm.lowp import wgemv, wvnni
    from tilefold.codegen.llvm.lowp.weight_only import GEMM_ROWS, dot_instruction

    weights, nbytes = layout.k * layout.n, layout.data.nbytes
    stream = nbytes / ctx.machine.bandwidth(nbytes)
    if rows >= GEMM_ROWS and not dot:
        unpack = max(stream, 4 * weights / ctx.machine.bandwidth(4 * weights))
        return (2 * rows * weights / (ctx.machine.gflops * 1e9 * GEMM_EFFICIENCY) + unpack
                + 2 * ctx.machine.call_s)
    kind = dot_instruction(layout.lanes, ctx.target) if dot else "float"
    per_pass = (wvnni if dot else wgemv).rows_per_pass(layout.lanes, layout.panels_per_tile)
    decode, multiply = _OPS[kind, 4 if layout.decoder.nibbles else 8]
    passes = -(-rows // min(per_pass, 8))
    ops = weights / (layout.lanes * (4 if dot else 1)) * (decode * passes + multiply * rows)
    compute = ops * 2 * layout.lanes / (ctx.machine.gflops * 1e9)
    return max(compute, stream) + ctx.machine.call_s


def _weight_layout(problem: Problem, ctx: Context, mm: Operation, deq: Operation):
    """The stream layout (`codegen/llvm/lowp/weight_only.stream_layout`) of `deq`'s constant codes,
    scales (and zero points) for the target, built once per codes array, and kept on disk
    where they are mapped from files (`codegen/llvm/lowp/layout_cache.py`). It is the weight's only
    copy the kernels read: the packed QuantizedTensor it is made from is dropped, and where the
    codes are mapped from a file (a weight cache) their pages are released."""
    from tilefold.codegen.llvm.lowp.layout_cache import cached
    from tilefold.codegen.llvm.lowp.weight_only import layout_kind, stream_layout
    from tilefold.quant import QuantizedTensor

    sources = [problem.constants[v] for v in deq.operands]
    axis = 1 if problem.attrs(mm)["transpose_b"] else 0  # the contraction axis of B as stored
    fmt = _format_of(problem, deq)
    corrected = len(sources) > 2
    code = fmt.asymmetric_code if corrected else fmt.code
    lanes, decoder = layout_kind(code.name, corrected, ctx.target)

    def build():
        codes, scale, *zero_point = sources
        return stream_layout(QuantizedTensor.from_codes(
            fmt, codes, axis, scale, zero_point[0] if zero_point else None), ctx.target, codes)

    def made():
        layout = cached(sources, (fmt.name, axis, lanes, decoder, num_threads()), decoder, build)
        release_pages(*sources)
        return layout

    return _packed_once(sources[0], ("weight-only", axis, ctx.target.name), made)


def _weight_only(problem: Problem, mm: Operation, prologue: list[Operation]
                 ) -> Operation | str | None:
    """The `dequantize` of constant codes that is B of `mm` (the weight-only GEMM runs it), a
    refusal when B is dequantized some other way, or None when nothing is dequantized."""
    deqs = [op for op in prologue if op.name == "dequantize"]
    if not deqs:
        return None
    deq = deqs[0]
    if len(deqs) > 1 or len(prologue) > 1 or deq.results[0] is not mm.operands[1]:
        return "dequantize other than of B alone (weight-only GEMM: x @ dequantize(codes))"
    if any(v not in problem.constants for v in deq.operands):
        return "dequantize of codes known only at run time (weight-only GEMM: constant codes)"
    a, b = (problem.types[v] for v in mm.operands)
    attrs = problem.attrs(mm)
    if str(a.dtype) != "f32" or str(b.dtype) != "f32" or len(b.shape) != 2 \
            or attrs["transpose_a"]:
        return "weight-only GEMM: f32 x rows (not transposed) times a 2-D dequantized f32 B"
    fmt = _format_of(problem, deq)
    if fmt is None:
        return f"no weight-only kernel for {problem.types[deq.operands[0]].dtype} codes"
    if fmt.bits == 4 and problem.shape(mm.operands[0])[-1] % 2:
        return "weight-only GEMM: 4-bit codes pack two a byte along K; K is odd"
    return deq


def _format_of(problem: Problem, deq: Operation):
    """The quantized format whose codes `deq` reads (asymmetric when it has a zero point)."""
    from tilefold.quant import FORMATS

    code = str(problem.types[deq.operands[0]].dtype)
    zero_point = len(deq.operands) > 2
    return next((f for f in FORMATS.values() if str(f.asymmetric_code if zero_point else f.code)
                 == code), None)


def build_weight_only(problem: Problem, ctx: Context, mm: Operation, deq: Operation,
                      epi: tuple | None, dot: bool = False) -> Kernel:
    """x @ dequantize(codes, scales) by the weight-only GEMV/skinny GEMM (`codegen/llvm/lowp`),
    one native call on A's and C's arrays as they are (C-contiguous: rows of K and of N),
    then the epilogue's row program over C."""
    from tilefold.codegen.llvm.lowp.weight_only import prepare_layout

    layout = _weight_layout(problem, ctx, mm, deq)
    a_in = problem.inputs.index(mm.operands[0])
    a_shape = problem.shape(mm.operands[0])
    rows, k = int(np.prod(a_shape[:-1])), a_shape[-1]
    c_val = mm.results[0]
    c_at, scratch = _c_place(problem, c_val)
    epilogue = _Epilogue(problem, ctx, epi, c_val)
    call = None
    if rows and k and layout.n:
        call = prepare_layout(layout, rows, k, 1, layout.n, ctx.target, ctx.threads, dot)

    def run(*arrays: np.ndarray) -> None:
        c = arrays[c_at]
        if call is None:
            c[...] = 0
        else:
            call.run(arrays[a_in], c)
        epilogue.run(c, arrays)

    def calls(*arrays: np.ndarray) -> list[NativeCall] | None:
        c = arrays[c_at]
        gemm = [] if call is None else call.calls(arrays[a_in], c)
        rest = epilogue.calls(c, arrays)
        return None if gemm is None or rest is None or call is None else [*gemm, *rest]

    kind = "int8 x " if dot else ""
    name = f"weight-only {kind}{_format_of(problem, deq).name}"
    return _kernel(run, name, epilogue, calls, scratch)


def _lanes(ctx: Context) -> int:
    """Vector width of the epilogue's row programs: `MATH_VECTORS` registers' worth, so that
    a math function's chains overlap (gelu 1.5x on Zen 1; the rest runs as fast)."""
    return vector_lanes(ctx.target) * MATH_VECTORS


def _lowp_refusal(problem: Problem, mm: Operation, target: Target) -> str | None:
    """Why the low-precision GEMM cannot run this matmul, or None."""
    from tilefold.quant.api import has_lowp_kernel

    a, b = (problem.types[v] for v in mm.operands)
    if not has_lowp_kernel(a.dtype.np_dtype, b.dtype.np_dtype):
        return (f"no GEMM for {a.dtype} x {b.dtype} (building blocks: f32 x f32, bf16 x bf16, "
                "f16 x f16, u8 x i8, i8 x i8)")
    if len(b.shape) > 2:
        return (f"the low-precision GEMM takes a 2-D B (matmul_lowp: B[K, N]); B is {b} "
                "(batched B runs op by op)")
    return _target_refusal(target, a.dtype.np_dtype, b.dtype.np_dtype)


@functools.cache
def _target_refusal(target: Target, a: np.dtype, b: np.dtype) -> str | None:
    """Why `target` has no low-precision kernel for A of dtype `a` and B of `b`, or None."""
    from tilefold.quant.api import prepack_lowp

    try:
        prepack_lowp(np.zeros((1, 1), b), a, target=target)
    except TilefoldError as exc:
        return f"no low-precision kernel on {target.name}: {exc.message}"
    return None


def _may_be_one_row(rows: tuple, min_size: int) -> bool:
    """Whether rows of these dims (ints, symbolic dims at least `min_size`) may number one at
    some call while not all static: a graph whose GEMM may run as a GEMV at one size."""
    if not any(isinstance(d, SymDim) for d in rows):
        return False
    return int(np.prod([dims.least(d.name, min_size) if isinstance(d, SymDim) else d
                        for d in rows])) <= 1


def _lowp_extra_bytes(problem: Problem, mm: Operation, prepack: bool, c: Value) -> float:
    """What `matmul_lowp` moves beyond the group's inputs and outputs: A packed on each call
    (read and written once more), B too unless prepacked, and an i32 C that is an output
    copied there from the sums it returns."""
    def size(v: Value) -> float:
        t = problem.types[v]
        return float(np.prod(t.shape)) * t.dtype.bits / 8

    a, b = mm.operands
    extra = 2 * size(a) + (0.0 if prepack else 2 * size(b))
    if problem.types[c].dtype.is_integer and c in problem.outputs:
        extra += 2 * size(c)
    return extra


def _lowp_gflops(ctx: Context, peak: str) -> float:
    """The measured multiply-accumulate peak of the probe `peak` (f32's where none runs)."""
    try:
        return measured_peak_gflops(ctx.target, peak, ctx.threads)
    except TilefoldError:
        return ctx.machine.gflops


class _Operands:
    """How the GEMM reads A and B from a call's arrays: through the prologue's views, with the
    transpose flags applied; a 1-D operand is a [1, K] row (A) or a [K, 1] column (B) of a 2-D
    GEMM, as in NumPy, and C gets the same size-1 dim back (`c`), so the epilogue still sees
    C's own shape."""

    def __init__(self, problem: Problem, mm: Operation, prologue: list[Operation]):
        self.views: dict[Value, tuple] = {v: (i, []) for i, v in enumerate(problem.inputs)}
        for op in prologue:
            index, chain = self.views[op.operands[0]]
            self.views[op.results[0]] = (index, [*chain, _view(op, problem)])
        attrs = problem.attrs(mm)
        self.a_val, self.b_val = mm.operands
        self.ta, self.tb = attrs["transpose_a"], attrs["transpose_b"]
        self.a_vec, self.b_vec = (len(problem.shape(v)) == 1 for v in mm.operands)

    def operand(self, v: Value, arrays) -> np.ndarray:
        index, chain = self.views[v]
        x = arrays[index]
        for f in chain:
            x = f(x)
        return x

    @staticmethod
    def oriented(x: np.ndarray, flag: bool) -> np.ndarray:
        return x.swapaxes(-1, -2) if flag else x

    def a(self, arrays) -> np.ndarray:
        a = self.operand(self.a_val, arrays)
        return a[None, :] if self.a_vec else self.oriented(a, self.ta)

    def b(self, arrays) -> np.ndarray:
        b = self.operand(self.b_val, arrays)
        return b[:, None] if self.b_vec else self.oriented(b, self.tb)

    def c(self, c: np.ndarray) -> np.ndarray:
        c = c[..., None] if self.b_vec else c
        return c[..., None, :] if self.a_vec else c


class _Epilogue:
    """The epilogue's row kernel over C and a call's arrays: `run(c, arrays)` runs it (nothing
    without an epilogue), `calls(c, arrays)` lists its native calls; `kernel` is None without."""

    def __init__(self, problem: Problem, ctx: Context, epi: tuple | None, c_val: Value):
        self.kernel = None if epi is None else _epilogue_kernel(problem, ctx, epi)
        self.picks: list[int] = []
        if epi is not None:
            _, ins, outs = epi
            n_in = len(problem.inputs)
            # Where each epilogue argument comes from: -1 is C, else an index into the arrays.
            self.picks = [-1 if v is c_val else problem.inputs.index(v) for v in ins]
            self.picks += [n_in + problem.outputs.index(v) for v in outs]

    def _args(self, c: np.ndarray, arrays) -> list[np.ndarray]:
        return [c if i < 0 else arrays[i] for i in self.picks]

    def run(self, c: np.ndarray, arrays) -> None:
        if self.kernel is not None:
            self.kernel.run(*self._args(c, arrays))

    def calls(self, c: np.ndarray, arrays) -> list[NativeCall] | None:
        return [] if self.kernel is None else self.kernel.calls(*self._args(c, arrays))


def _c_place(problem: Problem, c_val: Value) -> tuple[int, tuple]:
    """Where a GEMM's f32 C lives in its kernel's arrays (inputs, outputs, scratch): the
    group's output when C is one, else the kernel's one scratch array (`Kernel.scratch`: a
    buffer of the plan's pool, shared with the other GEMMs, not one held per kernel); and the
    scratch the kernel asks for."""
    n_in, n_out = len(problem.inputs), len(problem.outputs)
    if c_val in problem.outputs:
        return n_in + problem.outputs.index(c_val), ()
    return n_in + n_out, ((tuple(problem.shape(c_val)), np.float32),)


def _c_probe(shape: tuple) -> np.ndarray:
    """An f32 array of `shape` with C-contiguous strides and no memory of its own: what a GEMM
    plan is made on, before any C exists."""
    strides = tuple(4 * int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))
    return np.lib.stride_tricks.as_strided(np.empty(1, np.float32), shape, strides,
                                           writeable=False)


def _kernel(run, gemm: str, epilogue: _Epilogue, calls=None, scratch: tuple = ()) -> Kernel:
    epi_kernel = epilogue.kernel
    if epi_kernel is None:
        return Kernel(run, f"// GEMM {gemm} only", calls=calls, scratch=scratch)
    return Kernel(run, lambda: f"// GEMM {gemm} + epilogue\n{epi_kernel.source}",
                  epi_kernel.asm, calls=calls, scratch=scratch)


# Packed copies of constant weights, by the weight array and how it was packed: every problem
# multiplying by one weight (each prompt length, each decode plan) shares one copy, which lives
# as long as the weight does.
_PACKED: dict[tuple, object] = {}


def _packed_once(weight: np.ndarray, how: tuple, pack: Callable[[], object]) -> object:
    key = (id(weight), *how)
    packed = _PACKED.get(key)
    if packed is None:
        packed = _PACKED[key] = pack()
        weakref.finalize(weight, _PACKED.pop, key, None)
    return packed


def build_gemm(problem: Problem, ctx: Context, mm: Operation, prologue: list[Operation],
               epi: tuple | None, prepack: bool) -> Kernel:
    module = gemm_module(ctx.target)
    ops = _Operands(problem, mm, prologue)
    c_val = mm.results[0]
    c_at, scratch = _c_place(problem, c_val)
    c_probe = _c_probe(tuple(problem.shape(c_val)))
    probe = [np.empty(t.shape, np.float32) for t in problem.in_types()]
    a0, b0 = ops.a(probe), ops.b(probe)
    packed = plan = None
    if prepack:  # once, at build time; a transposed weight is packed from its strided view
        weight = problem.constants[ops.b_val]
        packed = _packed_once(weight, ("f32", ops.tb, module.kernel.name),
                              lambda: PackedMatrix(ops.oriented(weight, ops.tb), module))
    if c_probe.size and a0.shape[-1]:  # else C is empty or an empty sum (zeros): no GEMM
        plan = make_plan(module, a0, packed if packed is not None else b0, ops.c(c_probe), 0,
                         ctx.threads)
    b_arg = packed.data if packed is not None else None
    epilogue = _Epilogue(problem, ctx, epi, c_val)

    def run(*arrays: np.ndarray) -> None:
        c = arrays[c_at]
        if plan is None:
            c[...] = 0
        else:
            plan(ops.a(arrays), b_arg if b_arg is not None else ops.b(arrays), ops.c(c))
        epilogue.run(c, arrays)

    def calls(*arrays: np.ndarray) -> list[NativeCall] | None:
        c = arrays[c_at]
        gemm = None if plan is None else plan.call(
            ops.a(arrays), b_arg if b_arg is not None else ops.b(arrays), ops.c(c))
        rest = epilogue.calls(c, arrays)
        return None if gemm is None or rest is None else [gemm, *rest]

    return _kernel(run, module.kernel.name, epilogue, calls, scratch)


def build_lowp_gemm(problem: Problem, ctx: Context, mm: Operation, prologue: list[Operation],
                    epi: tuple | None, prepack: bool) -> Kernel:
    """The low-precision GEMM (`matmul_lowp`) into f32 (bf16/f16) or i32 (8-bit) sums, then the
    row program; an i32 C that is an output is copied there."""
    from tilefold.quant.api import matmul_lowp, prepack_lowp

    ops = _Operands(problem, mm, prologue)
    c_val = mm.results[0]
    c_shape = problem.shape(c_val)
    integer = problem.types[c_val].dtype.is_integer
    acc = np.int32 if integer else np.float32
    n_in = len(problem.inputs)
    c_out = problem.outputs.index(c_val) if integer and c_val in problem.outputs else None
    a_dtype = problem.types[ops.a_val].dtype.np_dtype
    probe = [np.empty(t.shape, t.dtype.np_dtype) for t in problem.in_types()]
    empty = not np.prod(c_shape) or not ops.a(probe).shape[-1]  # C is empty or zeros
    b_arg = None
    if prepack and not empty:  # once, at build time, from the (transposed) weight's view
        weight = problem.constants[ops.b_val]
        b_arg = _packed_once(weight, ("lowp", ops.tb, str(a_dtype), ctx.target.name),
                             lambda: prepack_lowp(ops.oriented(weight, ops.tb), a_dtype,
                                                  target=ctx.target))
    epilogue = _Epilogue(problem, ctx, epi, c_val)

    def run(*arrays: np.ndarray) -> None:
        if empty:
            c = np.zeros(c_shape, acc)
        else:
            b = b_arg if b_arg is not None else ops.b(arrays)
            c = matmul_lowp(ops.a(arrays), b, target=ctx.target, threads=ctx.threads)
            c = c.reshape(c_shape)
        if c_out is not None:
            arrays[n_in + c_out][...] = c
        epilogue.run(c, arrays)

    kind = "x".join(str(problem.types[v].dtype) for v in mm.operands)
    return _kernel(run, f"matmul_lowp {kind}", epilogue)


# The modules whose code shapes an epilogue's IR (with the row kernel's: its cache fingerprint).
_EPILOGUE_GENERATORS = ("tilefold.codegen.rowprog", "tilefold.codegen.llvm",
                        "tilefold.codegen.lower", "tilefold.codegen.llvm.vecmath")


def _epilogue_kernel(problem: Problem, ctx: Context, epi: tuple) -> Kernel:
    from tilefold.codegen.llvm.rowprog import Emitter  # on first use, as in `propose`

    prog, ins, outs = epi
    lanes = _lanes(ctx)
    fingerprint = f"{source_digest(*_EPILOGUE_GENERATORS)}|{prog!r}|{lanes}"
    return Kernel.native(generated_row_kernel(
        fingerprint, "tf_epilogue", len(ins) + len(outs), prog.rows,
        prog.n, ctx.threads, ctx.target, lambda: Emitter(prog, lanes, ctx.target.features)))
