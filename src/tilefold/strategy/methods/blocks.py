"""Building blocks: the BLIS-shaped GEMM (hand-written micro-kernels) with a generated epilogue.

Prologues become strided views (transposes) or broadcast batch dims the GEMM reads in place; a
constant B is packed once. The epilogue (bias, activation, residual, scaling, row softmax or
norms) is a row program run over C right after the GEMM, while C is still in cache. The GEMM
has no in-register epilogue hook yet, so C makes one extra trip through the caches.
"""

from __future__ import annotations

import numpy as np

from tilefold.codegen.cpu.rowkernel import generated_row_kernel
from tilefold.codegen.gemm.module import gemm_module
from tilefold.codegen.gemm.plan import make_plan
from tilefold.codegen.gemm.prepack import PackedMatrix
from tilefold.ir import Operation, Value
from tilefold.passes.fusion import FREE_PROLOGUES  # the prologues that are views
from tilefold.runtime import source_digest
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem

GEMM_EFFICIENCY = 0.8


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
    generators = ("tilefold.codegen.gemm", "tilefold.codegen.cpu",
                  "tilefold.codegen.rowprog", "tilefold.codegen.lower")

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        # On first use: `import tilefold` does not load the row-program generator.
        from tilefold.codegen.rowprog import Emitter, NotARowProgram, build_program

        matmuls = [op for op in problem.body if op.name == "matmul"]
        if len(matmuls) != 1:
            return "needs exactly one matmul in the group"
        mm = matmuls[0]
        if any(str(t.dtype) != "f32" for t in problem.in_types()):
            return "the GEMM building blocks are f32 here (bf16/int8 micro-kernels not wired)"
        at = problem.body.index(mm)
        prologue, epilogue = problem.body[:at], problem.body[at + 1:]
        bad = [op.name for op in prologue if op.name not in FREE_PROLOGUES]
        if bad:
            return (f"prologue {', '.join(bad)} needs a packing-time conversion hook in the "
                    "GEMM (not available)")
        a_shape, b_shape = (problem.shape(v) for v in mm.operands)
        if not epilogue and len(a_shape) == 2 and len(b_shape) == 1:
            return "a lone matrix @ vector product is the LTO library's GEMV"
        epi = None
        if epilogue:
            c = mm.results[0]
            ins = [c, *dict.fromkeys(v for op in epilogue for v in op.operands
                                     if v in problem.inputs)]
            outs = [v for v in problem.outputs if v is not c]
            try:
                epi = (build_program(problem.types, problem.constants, list(epilogue), ins,
                                     outs, c), ins, outs)
                Emitter(epi[0], _lanes(ctx))  # refuses now what it could not emit at build
            except NotARowProgram as exc:
                return f"epilogue: {exc}"
        w = work(problem)
        c_bytes = 4 * float(np.prod(problem.shape(mm.results[0])))
        estimate = (roofline(w.gemm_flops, w.bytes_fused, ctx.machine, GEMM_EFFICIENCY)
                    + (roofline(w.flops - w.gemm_flops, 2 * c_bytes, ctx.machine, 0.5)
                       if epi else 0.0) + ctx.machine.call_s * (2 if epi else 1))
        prepack = mm.operands[1] in problem.constants and len(b_shape) == 2
        config = {"prepack": prepack, "epilogue": bool(epi)}
        note = "epilogue as a row program over C" if epi else ""
        return [self.candidate(config, estimate,
                               lambda: build_gemm(problem, ctx, mm, prologue, epi, prepack),
                               note)]


def _lanes(ctx: Context) -> int:
    """Vector width of the epilogue's row programs."""
    return max(4, ctx.target.vector_bits // 32)


def build_gemm(problem: Problem, ctx: Context, mm: Operation, prologue: list[Operation],
               epi: tuple | None, prepack: bool) -> Kernel:
    module = gemm_module(ctx.target)
    views: dict[Value, tuple] = {v: (i, []) for i, v in enumerate(problem.inputs)}
    for op in prologue:
        index, chain = views[op.operands[0]]
        views[op.results[0]] = (index, [*chain, _view(op, problem)])

    def operand(v: Value, arrays) -> np.ndarray:
        index, chain = views[v]
        x = arrays[index]
        for f in chain:
            x = f(x)
        return x

    attrs = problem.attrs(mm)
    a_val, b_val = mm.operands

    def oriented(x, flag):
        return x.swapaxes(-1, -2) if flag else x

    # A 1-D operand is a [1, K] row (A) or a [K, 1] column (B) of a 2-D GEMM, as in NumPy;
    # C gets the same size-1 dim back as a view, so the epilogue still sees C's own shape.
    a_vec, b_vec = (len(problem.shape(v)) == 1 for v in mm.operands)

    def gemm_a(arrays):
        a = operand(a_val, arrays)
        return a[None, :] if a_vec else oriented(a, attrs["transpose_a"])

    def gemm_b(arrays):
        b = operand(b_val, arrays)
        return b[:, None] if b_vec else oriented(b, attrs["transpose_b"])

    def gemm_c(c):
        c = c[..., None] if b_vec else c
        return c[..., None, :] if a_vec else c

    c_val = mm.results[0]
    c_shape = problem.shape(c_val)
    n_in = len(problem.inputs)
    c_out = problem.outputs.index(c_val) if c_val in problem.outputs else None
    scratch = np.empty(c_shape, np.float32)
    probe = [np.empty(t.shape, np.float32) for t in problem.in_types()]
    a0, b0 = gemm_a(probe), gemm_b(probe)
    packed = plan = None
    if prepack:  # once, at build time; a transposed weight is packed from its strided view
        packed = PackedMatrix(oriented(problem.constants[b_val], attrs["transpose_b"]), module)
    if scratch.size and a0.shape[-1]:  # else C is empty or an empty sum (zeros): no GEMM
        plan = make_plan(module, a0, packed if packed is not None else b0, gemm_c(scratch), 0,
                         ctx.threads)
    b_arg = packed.data if packed is not None else None
    epi_kernel = _epilogue_kernel(problem, ctx, epi) if epi else None
    _, epi_ins, epi_outs = epi or (None, [], [])
    # Where each epilogue argument comes from: -1 is C, else an index into the arrays.
    picks = [-1 if v is c_val else problem.inputs.index(v) for v in epi_ins]
    picks += [n_in + problem.outputs.index(v) for v in epi_outs]

    def run(*arrays: np.ndarray) -> None:
        c = arrays[n_in + c_out] if c_out is not None else scratch
        if plan is None:
            c[...] = 0
        else:
            plan(gemm_a(arrays), b_arg if b_arg is not None else gemm_b(arrays), gemm_c(c))
        if epi_kernel is not None:
            epi_kernel.run(*(c if i < 0 else arrays[i] for i in picks))

    if epi_kernel is None:
        return Kernel(run, f"// GEMM {module.kernel.name} only")
    return Kernel(run, lambda: f"// GEMM {module.kernel.name} + epilogue\n{epi_kernel.source}",
                  epi_kernel.asm)


# The modules whose code shapes an epilogue's IR (with the row kernel's: its cache fingerprint).
_EPILOGUE_GENERATORS = ("tilefold.codegen.rowprog", "tilefold.codegen.lower",
                        "tilefold.codegen.llvm_util", "tilefold.codegen.vecmath")


def _epilogue_kernel(problem: Problem, ctx: Context, epi: tuple) -> Kernel:
    from tilefold.codegen.rowprog import Emitter  # on first use, as in `propose`

    prog, ins, outs = epi
    lanes = _lanes(ctx)
    fingerprint = f"{source_digest(*_EPILOGUE_GENERATORS)}|{prog!r}|{lanes}"
    return Kernel.native(generated_row_kernel(
        fingerprint, problem.kernel_symbol("tf_epilogue"), len(ins) + len(outs), prog.rows,
        prog.n, ctx.threads, ctx.target, lambda: Emitter(prog, lanes, ctx.target.features)))
