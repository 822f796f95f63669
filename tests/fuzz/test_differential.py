"""Differential fuzzing: random programs compiled by tilefold against float64 NumPy.

Programs mix GEMMs (batched, broadcast, either operand a constant) and their epilogues with
elementwise ops broadcasting in every legal way (against new operands and against earlier
values of the program), where with a comparison mask, integer powers, round trips through
f16/bf16, reductions over any axes with and without keepdims, softmax and norms on any axis,
views (transpose, reshape, slices with negative steps, expand/squeeze) and concat; dims are
drawn from edge sizes (0, 1, primes, powers of two) and often made equal (M == N == K).
Programs whose values leave the range of their error bounds are skipped. Inputs arrive with
odd layouts (reversed, strided, Fortran order).
The reference is computed by NumPy in float64, never by tilefold's interpreter, with an error
bound carried op by op (`programs.py`).

The CI run is bounded; `TILEFOLD_FUZZ_EXAMPLES=10000` runs a long one. Every program that ever
failed stays in `REGRESSIONS`, checked on every run.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import tilefold
from tests.fuzz.programs import (
    BINARY,
    COMPARE,
    NARROW,
    POWERS,
    REDUCE,
    UNARY,
    IllConditioned,
    Program,
    build,
)

EXAMPLES = int(os.environ.get("TILEFOLD_FUZZ_EXAMPLES", "150"))
DIMS = (0, 1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 64)
LAYOUTS = ("c", "flip", "step", "fortran")
EPILOGUE_SHAPES = ("row", "col", "scalar", "row2", "full")


def _shape_of(step: tuple, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The result shape of `step` on values of `shapes` (NumPy decides)."""
    kind, x = step[0], np.zeros(shapes[step[1]])
    if kind == "combine":
        return np.broadcast_shapes(x.shape, shapes[step[3]])
    if kind == "where":
        return np.broadcast_shapes(x.shape, step[3])
    if kind == "concat":
        return np.concatenate([x, np.zeros(step[2])], step[3]).shape
    if kind in ("binary", "matmul"):
        other = np.zeros(step[3])
        pair = (other, x) if step[5] else (x, other)
        return (np.matmul(*pair) if kind == "matmul" else pair[0] + pair[1]).shape
    if kind == "reduce":
        return np.sum(x, axis=step[3], keepdims=step[4]).shape
    if kind == "transpose":
        return np.transpose(x, step[2]).shape
    if kind == "reshape":
        return tuple(step[2])
    if kind == "slice":
        return x[tuple(slice(*s) for s in zip(*step[2:5], strict=True))].shape
    if kind == "expand_dims":
        return np.expand_dims(x, step[2]).shape
    if kind == "squeeze":
        return np.squeeze(x, step[2]).shape
    return x.shape  # unary, softmax, norms, pow, cast


@st.composite
def programs(draw) -> Program:
    square = draw(st.sampled_from((0, 1, 2, 3, 5, 7, 8, 13, 16, 17)))

    def dim():
        return square if square and draw(st.booleans()) else draw(st.sampled_from(DIMS))

    rank = draw(st.integers(0, 3))
    shapes = [tuple(dim() for _ in range(rank))]
    program = Program(inputs=list(shapes), seed=draw(st.integers(0, 2**20)),
                      layouts=[draw(st.sampled_from(LAYOUTS))])

    def operand_like(shape):
        """A shape that broadcasts against `shape`: leading dims dropped, some set to 1, and
        some of `shape`'s 1s widened (then `shape` is the one that broadcasts)."""
        cut = draw(st.integers(0, len(shape)))
        out = []
        for d in shape[cut:]:
            roll = draw(st.integers(0, 9))
            out.append(1 if roll < 3 else dim() if d == 1 and roll == 9 else d)
        return tuple(out)

    def epilogue(shape):
        """One classic GEMM epilogue operand: bias on N, on M, a scalar, [1, N], all of C."""
        pick = draw(st.sampled_from(EPILOGUE_SHAPES))
        if len(shape) < 2 or pick == "scalar":
            return ()
        m, n = shape[-2:]
        return {"row": (n,), "col": (m, 1), "row2": (1, n), "full": shape}[pick]

    def step_on(src, shape):
        rank = len(shape)
        kind = draw(st.sampled_from(("unary", "binary", "matmul", "matmul", "matmul", "reduce",
                                     "softmax", "norm", "view", "combine", "where", "pow",
                                     "cast", "concat")))
        if kind == "combine":
            fits = [i for i, s in enumerate(shapes) if _broadcasts(s, shape)]
            return [("combine", src, draw(st.sampled_from(BINARY)), draw(st.sampled_from(fits)),
                     draw(st.booleans()))]
        if kind == "where":
            return [("where", src, draw(st.sampled_from(sorted(COMPARE))), operand_like(shape),
                     draw(st.booleans()))]
        if kind == "pow":
            return [("pow", src, draw(st.sampled_from(POWERS)))]
        if kind == "cast":
            return [("cast", src, draw(st.sampled_from(sorted(NARROW))))]
        if kind == "concat" and rank >= 1:
            axis = draw(st.integers(-rank, rank - 1))
            other = tuple(dim() if i == axis % rank else d for i, d in enumerate(shape))
            return [("concat", src, other, axis, draw(st.booleans()), draw(st.booleans()))]
        if kind == "unary":
            return [("unary", src, draw(st.sampled_from(sorted(UNARY))))]
        if kind == "binary":
            return [("binary", src, draw(st.sampled_from(BINARY)), operand_like(shape),
                     draw(st.booleans()), draw(st.booleans()))]
        if kind == "matmul" and rank >= 1:
            swap = rank >= 2 and draw(st.integers(0, 3)) == 0
            batch = shape[:-2] if rank >= 3 and draw(st.booleans()) else ()
            if draw(st.integers(0, 4)) == 0:  # a vector: matrix @ vector, vector @ matrix, dot
                other = (shape[-2],) if swap else (shape[-1],)
            elif swap:
                other = (*batch, dim(), shape[-2])
            else:
                other = (*batch, shape[-1], dim() if draw(st.booleans()) else shape[-1])
            steps = [("matmul", src, "matmul", other, draw(st.booleans()), swap)]
            for _ in range(draw(st.integers(0, 2))):  # an epilogue to fuse
                out = _shape_of(steps[0], shapes)
                pick = draw(st.sampled_from(("binary", "binary", "unary", "unary", "where",
                                             "pow", "cast")))
                if pick == "binary":
                    steps.append(("binary", None, draw(st.sampled_from(BINARY)), epilogue(out),
                                  True, draw(st.integers(0, 4)) == 0))
                elif pick == "where":
                    steps.append(("where", None, draw(st.sampled_from(sorted(COMPARE))),
                                  epilogue(out), draw(st.booleans())))
                elif pick == "pow":
                    steps.append(("pow", None, draw(st.sampled_from(POWERS))))
                elif pick == "cast":
                    steps.append(("cast", None, draw(st.sampled_from(sorted(NARROW)))))
                else:
                    steps.append(("unary", None, draw(st.sampled_from(sorted(UNARY)))))
            return steps
        if kind == "reduce":
            name = draw(st.sampled_from(REDUCE))
            axes = None if rank == 0 or draw(st.integers(0, 3)) == 0 else tuple(sorted(
                draw(st.sets(st.integers(0, rank - 1), min_size=1))))
            reduced = [shape[a] for a in (range(rank) if axes is None else axes)]
            if name != "reduce_sum" and 0 in reduced:
                return []
            return [("reduce", src, name, axes, draw(st.booleans()))]
        if kind == "softmax" and rank >= 1:
            axis = draw(st.integers(-rank, rank - 1))
            if shape[axis] == 0:
                return []
            return [(draw(st.sampled_from(("softmax", "log_softmax"))), src, axis)]
        if kind == "norm" and rank >= 1:
            axis = -1 if rank == 1 or draw(st.booleans()) else -2
            if 0 in shape[axis:]:
                return []
            return [(draw(st.sampled_from(("layer_norm", "rms_norm"))), src, axis)]
        if kind == "view" and rank >= 1:
            return [_view(draw, src, shape)]
        return []

    for _ in range(draw(st.integers(1, 5))):
        count = len(shapes)
        src = count - 1 if draw(st.integers(0, 2)) else draw(st.integers(0, count - 1))
        for step in step_on(src, shapes[src]):
            step = (step[0], len(shapes) - 1 if step[1] is None else step[1], *step[2:])
            program.steps.append(step)
            shapes.append(_shape_of(step, shapes))
    extra = draw(st.integers(1, len(shapes) - 1)) if len(shapes) > 2 else None
    program.outputs = [len(shapes) - 1] + ([extra] if extra and draw(st.booleans()) else [])
    return program


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def _view(draw, src: int, shape: tuple[int, ...]) -> tuple:
    rank = len(shape)
    kind = draw(st.sampled_from(("transpose", "reshape", "slice", "expand_dims", "squeeze")))
    if kind == "transpose" and rank >= 2:
        return ("transpose", src, tuple(draw(st.permutations(range(rank)))))
    if kind == "reshape":
        if rank >= 2 and draw(st.booleans()):  # merge two neighbours
            i = draw(st.integers(0, rank - 2))
            return ("reshape", src, (*shape[:i], shape[i] * shape[i + 1], *shape[i + 2:]))
        return ("reshape", src, (int(np.prod(shape)),))
    if kind == "slice":
        starts, stops, steps = [], [], []
        for d in shape:
            step = draw(st.sampled_from((1, 1, 2, 3, -1, -2)))
            lo, hi = sorted(draw(st.integers(-d - 1, d + 1)) for _ in range(2))
            starts.append(hi if step < 0 else lo)
            stops.append(lo if step < 0 else hi)
            steps.append(step)
        return ("slice", src, tuple(starts), tuple(stops), tuple(steps))
    if kind == "squeeze" and 1 in shape:
        return ("squeeze", src, (shape.index(1),))
    return ("expand_dims", src, (draw(st.integers(0, rank)),))


def _laid_out(x: np.ndarray, layout: str) -> np.ndarray:
    """The same values in memory of another layout: reversed, every other element, column-major."""
    if layout == "flip" and x.ndim:
        axes = tuple(range(x.ndim))
        return np.flip(np.flip(x, axes).copy(), axes)
    if layout == "step" and x.ndim:
        wide = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "fortran" and x.ndim >= 2:
        return np.asfortranarray(x)
    return x


def check(program: Program) -> None:
    built = build(program)
    args = [_laid_out(a, lay) for a, lay in itertools.zip_longest(built.args, program.layouts,
                                                                  fillvalue="c")]
    graph = tilefold.compile(built.module)
    for _ in range(2):  # the second call runs the plan the first one made
        got = graph(*args)
        assert len(got) == len(built.refs)
        for g, ref in zip(got, built.refs, strict=True):
            assert g.shape == ref.value.shape, (g.shape, ref.value.shape, program)
            assert g.dtype == np.float32
            bound = 4 * ref.err + 1e-30
            error = np.abs(g.astype(np.float64) - ref.value)
            worst = float(error.max()) if error.size else 0.0
            assert (error <= bound).all(), f"error {worst:.3g} > bound {bound:.3g}: {program}"


REGRESSIONS = [
    # x @ W + b with M == N: the bias was taken for one value per row.
    Program(inputs=[(8, 8)], steps=[("matmul", 0, "matmul", (8, 8), True, False),
                                    ("binary", 1, "add", (8,), True, False)], outputs=[2]),
    Program(inputs=[(5, 0)], steps=[("matmul", 0, "matmul", (0, 7), True, False),
                                    ("binary", 1, "add", (7,), True, False)], outputs=[2]),
    # An empty slice shares no memory with its operand: it was taken for a reshape's copy.
    Program(inputs=[(1,)], steps=[("unary", 0, "abs"), ("slice", 1, (0,), (0,), (1,))],
            outputs=[2]),
    # K = 0: C is a sum of no terms (zeros); the GEMM wrote garbage, swapped or batched.
    Program(inputs=[(0, 1)], steps=[("matmul", 0, "matmul", (1, 0), False, True)], outputs=[1]),
    Program(inputs=[(1, 0, 0)], steps=[("unary", 0, "abs"),
                                       ("matmul", 1, "matmul", (0, 1), False, False),
                                       ("matmul", 2, "matmul", (1, 0), False, True)],
            outputs=[3, 1]),
    # Empty tensors: NumPy's all-0 strides made a norm's rows look broadcast (kernel IR error).
    Program(inputs=[(0, 8)], steps=[("layer_norm", 0, -1)], outputs=[1]),
    Program(inputs=[(2, 0, 0)], steps=[("unary", 0, "abs"),
                                       ("matmul", 1, "matmul", (0, 2), False, False),
                                       ("reduce", 2, "reduce_sum", (0,), False),
                                       ("layer_norm", 3, -1)], outputs=[4]),
    # A reduction of a 0-d value reduces no axes: fusion indexed the first of them.
    Program(inputs=[()], steps=[("binary", 0, "mul", (), True, False),
                                ("reduce", 1, "reduce_sum", None, False)], outputs=[2]),
    # A 1-D matmul with an epilogue: no method took it (blocks.gemm refused 1-D operands).
    Program(inputs=[(0,)], steps=[("matmul", 0, "matmul", (0, 0), False, False),
                                  ("unary", 1, "log_abs1")], outputs=[2]),
    Program(inputs=[(3,)], steps=[("matmul", 0, "matmul", (3, 5), False, False),
                                  ("unary", 1, "log_abs1")], outputs=[2]),
    # A comparison mask in a GEMM epilogue: row programs refused bool values (no method).
    Program(inputs=[(0, 0)], steps=[("matmul", 0, "matmul", (0, 0), False, True),
                                    ("pow", 1, 2), ("where", 2, "ge", (), False)], outputs=[3]),
    # x.T @ w with x.T also returned: the prologue's copy made fusion plan the matmul twice.
    Program(inputs=[(5, 3)], steps=[("transpose", 0, (1, 0)),
                                    ("matmul", 1, "matmul", (5, 4), False, False)],
            outputs=[2, 1]),
    # A sum over a dim of size 1 that a keepdims sum left: taken for a second set of axes.
    Program(inputs=[(1,)], steps=[("reduce", 0, "reduce_sum", None, True),
                                  ("reduce", 1, "reduce_sum", None, False), ("pow", 2, 2)],
            outputs=[3]),
]


@pytest.mark.parametrize("program", REGRESSIONS, ids=lambda p: "-".join(s[0] for s in p.steps))
def test_programs_that_once_failed(program):
    check(program)


@settings(max_examples=EXAMPLES, deadline=None)
@given(programs())
def test_random_programs_match_float64_numpy(program):
    try:
        check(program)
    except IllConditioned:
        reject()
