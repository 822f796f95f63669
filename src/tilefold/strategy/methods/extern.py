"""Extern methods: run a group op by op through NumPy or PyTorch (always available: NumPy).

Each op uses a library call in its own dtype when one has the reference's meaning, else the
reference implementation itself, so an extern kernel is never wrong, only slower. In strict
mode (`tilefold.errors.strict()`) an extern method that would evaluate float math through a
reference implementation (in f64, rounded once: the oracle tests compare with) declines the
group; what the reference computes exactly (moving data, conversions, integer and bool results)
it may still run that way.

Libraries run on one thread: in a compiled graph tilefold's pool owns the cores. PyTorch's
OpenMP workers and OpenBLAS's threads keep spinning after a parallel call, beside tilefold's
workers, and the next native kernel ran up to 2.5x slower (a 5.5 ms GEMM took 10.2 ms right
after a 2-thread `torch.mm`; a 3.1 ms one took 7.5-8.8 ms when the tuner timed it between
calls of NumPy's threaded matmul). The tuner cannot see that cost on the library's side, so it
picked library calls that slowed whole models.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Callable

import numpy as np
from threadpoolctl import ThreadpoolController

from tilefold import dtypes
from tilefold.errors import strict
from tilefold.ir import Operation
from tilefold.ir.interpreter import run_region
from tilefold.ir.ops import VIEWS
from tilefold.strategy.cost import Work, product_flops, roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem

Fn = Callable[..., np.ndarray]
REFERENCE_FLOPS = 5e9  # matrix products in the f64 reference (NumPy on 2 cores)


def _axes(attrs: dict, rank: int):
    return tuple(range(rank)) if attrs["axes"] is None else tuple(attrs["axes"])


def _matmul(a, b, attrs, mm=np.matmul):
    if attrs["transpose_a"] and a.ndim >= 2:
        a = a.swapaxes(-1, -2)
    if attrs["transpose_b"] and b.ndim >= 2:
        b = b.swapaxes(-1, -2)
    return mm(a, b)


def _softmax(x, attrs):
    e = np.exp(x - x.max(axis=attrs["axis"], keepdims=True, initial=-np.inf))  # empty rows
    return e / e.sum(axis=attrs["axis"], keepdims=True)


def _cumsum(x, attrs):
    """Running sums as PyTorch's CPU kernel forms them: integers in their own dtype (wrapping
    like the reference), f32 and f64 accumulated in f64, 16-bit floats in f32; rounded once."""
    kind = dtypes.dtype(x.dtype)
    wide = x.dtype if not kind.is_float else np.float64 if kind.bits >= 32 else np.float32
    return np.cumsum(x, axis=attrs["axis"], dtype=wide).astype(x.dtype, copy=False)


def _reduce(fn):
    return lambda x, attrs: fn(x, axis=_axes(attrs, x.ndim), keepdims=attrs["keepdims"])


NUMPY: dict[str, Fn] = {
    "matmul": _matmul,
    "add": lambda x, y, attrs: np.add(x, y),
    "sub": lambda x, y, attrs: np.subtract(x, y),
    "mul": lambda x, y, attrs: np.multiply(x, y),
    "div": lambda x, y, attrs: np.divide(x, y),  # floats only (integers truncate: reference)
    "max": lambda x, y, attrs: np.maximum(x, y),
    "min": lambda x, y, attrs: np.minimum(x, y),
    "neg": lambda x, attrs: np.negative(x),
    "abs": lambda x, attrs: np.abs(x),
    "exp": lambda x, attrs: np.exp(x),
    "log": lambda x, attrs: np.log(x),
    "floor": lambda x, attrs: np.floor(x),
    "tanh": lambda x, attrs: np.tanh(x),
    "sqrt": lambda x, attrs: np.sqrt(x),
    "relu": lambda x, attrs: np.maximum(x, x.dtype.type(0)),
    "reduce_sum": _reduce(np.sum),
    "reduce_max": _reduce(np.max),
    "reduce_min": _reduce(np.min),
    "reduce_mean": _reduce(np.mean),
    "softmax": _softmax,
    "cumsum": _cumsum,
    **VIEWS,  # layout ops: the views every path makes (`OpDef.view`)
}
LAYOUT = frozenset(VIEWS)
# Ops whose table entry is right for every dtype they accept, integers included.
ANY_DTYPE = frozenset({"cumsum", *LAYOUT})
# Ops whose reference is plain NumPy data movement, selection or one exact conversion, with no
# arithmetic evaluated in f64: running it is a library call like any other, even in strict mode.
EXACT_REFERENCE = frozenset(
    {"gather", "index", "index_put", "dim_size", "concat", "where", "cast", *LAYOUT}
)


def _torch_table() -> dict[str, Fn] | None:
    """PyTorch's kernels, where PyTorch is loaded already (a torch frontend's process): a
    process that never imported it (IR compiled from NumPy, a GGUF model) does not pay a
    second and 200 MB for a fallback."""
    if "torch" not in sys.modules:
        return None
    return _loaded_torch_table()


@functools.cache
def _loaded_torch_table() -> dict[str, Fn]:
    import torch
    import torch.nn.functional as F

    def wrap(fn):
        def run(*args):
            *arrays, attrs = args
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                out = fn(*(torch.from_numpy(np.asarray(a, order="C")) for a in arrays), attrs)
            finally:
                torch.set_num_threads(threads)
            return out.numpy()
        return run

    return {
        "matmul": wrap(lambda a, b, attrs: _matmul(a, b, attrs, torch.matmul)),
        "gelu": wrap(lambda x, attrs: F.gelu(x, approximate=attrs["approximate"])),
        "erf": wrap(lambda x, attrs: torch.erf(x)),
        "sigmoid": wrap(lambda x, attrs: torch.sigmoid(x)),
        "silu": wrap(lambda x, attrs: F.silu(x)),
        "softmax": wrap(lambda x, attrs: torch.softmax(x, attrs["axis"])),
        "log_softmax": wrap(lambda x, attrs: torch.log_softmax(x, attrs["axis"])),
        "layer_norm": wrap(lambda x, w, b, attrs: F.layer_norm(
            x, tuple(x.shape[attrs["axis"] % x.ndim:]), w, b, attrs["eps"])),
    }


def _library_runs(op: Operation, problem: Problem, table: dict[str, Fn]) -> bool:
    """Whether `table` computes `op` (library calls keep the dtype for floats; integer and bool
    math follows the reference)."""
    if op.name not in table:
        return False
    same = all(problem.types[v].dtype == problem.types[op.results[0]].dtype and
               problem.types[v].dtype.is_float for v in op.operands)
    return same or op.name in ANY_DTYPE


def op_function(op: Operation, problem: Problem, table: dict[str, Fn]) -> Callable:
    """A callable computing `op` on arrays: the library's version or the reference."""
    attrs = problem.attrs(op)
    if _library_runs(op, problem, table):
        fast = table[op.name]
        return lambda *args: fast(*args, attrs)
    return lambda *args: op.opdef.reference_op(list(args), attrs, op.regions, run_region)


def _float_math_by_reference(op: Operation, problem: Problem, table: dict[str, Fn]) -> bool:
    """Whether `op` would run through its reference and that computes a float in f64 (integer
    and bool results, and the `EXACT_REFERENCE` ops, come out exact)."""
    return (op.name not in EXACT_REFERENCE and not _library_runs(op, problem, table)
            and any(problem.types[r].dtype.is_float for r in op.results))


def strict_refusal(problem: Problem, table: dict[str, Fn], method: str) -> str | None:
    """In strict mode, why `method` declines `problem` (it would evaluate float math through a
    reference implementation); None when it may run."""
    if not strict():
        return None
    slow = sorted({op.name for op in problem.body if _float_math_by_reference(op, problem, table)})
    if not slow:
        return None
    return (f"strict mode: {method} would run the reference implementation of "
            f"{', '.join(slow)} (unset TILEFOLD_STRICT to allow it)")


@functools.cache
def _blas_controller() -> ThreadpoolController:
    return ThreadpoolController()  # finds the loaded BLAS libraries once


def _one_blas_thread():
    """Run NumPy's BLAS on one thread for the block (about 13 us)."""
    return _blas_controller().limit(limits=1, user_api="blas")


def build_extern(problem: Problem, table: dict[str, Fn], blas: bool = False) -> Kernel:
    """A kernel running the body op by op; results are copied into the output arrays.

    `blas`: the body calls NumPy's BLAS (matmul), which runs on one thread (see above)."""
    steps = [(op_function(op, problem, table), op.operands, op.results) for op in problem.body]
    inputs, outputs = problem.inputs, problem.outputs
    scope = _one_blas_thread if blas else contextlib.nullcontext

    def run(*arrays: np.ndarray) -> None:
        env = dict(zip(inputs, arrays, strict=False))
        with scope():
            for fn, operands, results in steps:
                with np.errstate(all="ignore"):  # IEEE results (NaN, inf) as compiled code gives
                    out = fn(*(env[v] for v in operands))
                if len(results) == 1:
                    env[results[0]] = out
                else:
                    env.update(zip(results, out, strict=True))
        for v, array in zip(outputs, arrays[len(inputs):], strict=True):
            np.copyto(array, env[v], casting="unsafe")

    names = ", ".join(f"{op.name}" for op in problem.body)
    return Kernel(run, f"// extern: {names}", strided=True, strided_out=True)


def extern_estimate(w: Work, problem: Problem, ctx: Context, per_op: float,
                    compute_eff: float = 0.7) -> float:
    """Op by op: every op reads and writes memory, plus one library call each."""
    return (roofline(w.flops, w.bytes_unfused, ctx.machine, compute_eff, 0.6)
            + per_op * len(problem.body))


def reference_penalty(problem: Problem, table: dict[str, Fn]) -> float:
    """Extra seconds for ops the library table lacks, which the f64 reference runs: ~20x a
    library call per element, and its matrix products (attention's) at a few GFLOP/s."""
    slow = [op for op in problem.body if op.name not in table and op.results]
    elements = sum(math.prod(problem.shape(op.results[0])) for op in slow)
    return 20e-9 * elements + sum(product_flops(problem, op) for op in slow) / REFERENCE_FLOPS


def _loop_products(problem: Problem) -> float:
    """Extra seconds for matmuls NumPy runs as plain loops, not BLAS: operands other than f32
    and f64 (bf16, f16, integers), charged at the reference's matrix-product rate."""
    loops = [op for op in problem.body if op.name == "matmul"
             and str(problem.types[op.operands[0]].dtype) not in ("f32", "f64")]
    return sum(product_flops(problem, op) for op in loops) / REFERENCE_FLOPS


@register_method
class NumpyExtern(Method):
    name = "extern.numpy"
    family = "extern"

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        refusal = strict_refusal(problem, NUMPY, self.name)
        if refusal is not None:
            return refusal
        w = work(problem)
        slow = [op.name for op in problem.body if op.name not in NUMPY]
        note = f"reference implementation for {', '.join(slow)}" if slow else ""
        blas = any(op.name == "matmul" for op in problem.body)
        estimate = (extern_estimate(w, problem, ctx, ctx.machine.numpy_op_s,
                                    0.7 / ctx.threads if blas else 0.7)
                    + reference_penalty(problem, NUMPY) + _loop_products(problem))
        return [self.candidate({}, estimate, lambda: build_extern(problem, NUMPY, blas),
                               note)]


@register_method
class TorchExtern(Method):
    name = "extern.torch"
    family = "extern"

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        table = _torch_table()
        if table is None:
            return "PyTorch is not loaded in this process"
        if any(str(t.dtype) == "bf16" for t in problem.types.values()):
            return "bf16 arrays do not pass to PyTorch here (torch.from_numpy has no bf16)"
        merged = {**NUMPY, **table}
        refusal = strict_refusal(problem, merged, self.name)
        if refusal is not None:
            return refusal
        w = work(problem)
        estimate = (extern_estimate(w, problem, ctx, 2 * ctx.machine.numpy_op_s,
                                    0.7 / ctx.threads)  # one thread (see the module's note)
                    + reference_penalty(problem, merged))
        return [self.candidate({}, estimate, lambda: build_extern(problem, merged))]
