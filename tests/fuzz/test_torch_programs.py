"""Differential fuzzing of the PyTorch path: random small torch programs through
torch.compile(backend="tilefold"), strict, against the same program run by PyTorch in float64,
with static shapes and with `dynamic=True`.

Each program is a chain of ops a model is made of (linear layers with and without bias,
matmuls, activations, softmax, layer_norm and rms_norm with and without weights, reductions with
and without keepdim, transposes, views, slices, concatenation, causal masks from `arange`,
broadcasting adds and muls) over edge sizes, and now and then a large one (`LARGE`: past a
GEMM's K and M cache blocks on every host in the target table, and enough rows that kernels
split them over threads). The float64 run is PyTorch's own, so the oracle shares nothing with
tilefold. Most groups holding a GEMM, a norm or a softmax must run native kernels, not extern
(`NATIVE_FLOOR`).

Under `dynamic=True` each program is called a second time with other sizes for the dims no
weight fixes (larger ones too): both results must match float64, and a program whose ops all
take symbolic sizes must not be traced again. `TILEFOLD_FUZZ_EXAMPLES` scales the count as for
the graph fuzzer.
"""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefold.frontend import report

torch = pytest.importorskip("torch")
F = torch.nn.functional

EXAMPLES = max(4, int(os.environ.get("TILEFOLD_FUZZ_EXAMPLES", "150")) // 10)
SIZES = (1, 2, 3, 5, 8, 13, 16)
# Past a KC of 256 (one K block up to 1.5 KC, `llvm/gemm/plan.py`) and an MC of ~1000 rows on 1 MiB
# of L2; a memory-bound kernel splits 1100 rows over threads.
LARGE = (300, 1100)
BUDGET = 1 << 21  # elements in any value of a program: keeps a large dim to a few of them
UNARY = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "tanh": torch.tanh,
         "sigmoid": torch.sigmoid, "neg": torch.neg}
SLICES = ((1, None), (None, -1), (-2, None), (0, 1), (1, -1))  # x[..., a:b] along an axis
NORM_EPS = 1e-3
# Ops whose groups are counted for the native floor (as the frontend tests' `assert_native`).
HEAVY = frozenset({"matmul", "layer_norm", "rms_norm", "softmax"})
NATIVE_FLOOR = 0.8


def trace(steps: list[tuple], shape: tuple[int, ...]) -> list[list[int]]:
    """The shape of every value the program makes from an input of `shape`."""
    cur, shapes = list(shape), [list(shape)]
    for step in steps:
        kind = step[0]
        if kind == "linear":
            cur[-1] = step[2]
        elif kind == "sum":
            cur = [1 if i == step[1] else d for i, d in enumerate(cur)] if step[2] else \
                [d for i, d in enumerate(cur) if i != step[1]]
        elif kind == "transpose":
            cur[-1], cur[-2] = cur[-2], cur[-1]
        elif kind == "view":
            cur = [*cur[:-2], cur[-2] * cur[-1]]
        elif kind == "cat":
            cur[step[1]] *= 2
        elif kind == "slice":
            cur[step[1]] = len(range(cur[step[1]])[slice(*SLICES[step[2]])])
        elif kind == "gram":
            cur[-1] = cur[-2]
        shapes.append(list(cur))
    return shapes


@st.composite
def torch_programs(draw):
    """(input shape, steps, seed, second-call sizes): each step a tuple naming an op and its
    parameters; the last maps first-call sizes of free dims to the sizes of a second call."""
    square = draw(st.sampled_from(SIZES))

    def dim(room: int) -> int:
        big = [d for d in LARGE if d <= room]
        if big and draw(st.integers(0, 5)) == 0:
            return draw(st.sampled_from(big))
        return draw(st.sampled_from((square, *SIZES)))

    shape: list[int] = []
    for _ in range(draw(st.integers(1, 3))):
        shape.append(dim(BUDGET // max(1, math.prod(shape))))
    steps: list[tuple] = []
    cur = list(shape)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("linear", "linear", "unary", "softmax", "norm", "sum",
                                     "transpose", "view", "bias", "cat", "slice", "gram",
                                     "mask")))
        rank = len(cur)
        if kind == "linear":
            out = draw(st.sampled_from((cur[-1], square, *SIZES))) if draw(st.integers(0, 3)) \
                else dim(BUDGET // max(1, math.prod(cur[:-1]) + cur[-1]))
            step = ("linear", cur[-1], out, draw(st.booleans()))
        elif kind == "unary":
            step = ("unary", draw(st.sampled_from(sorted(UNARY))))
        elif kind == "softmax":
            step = ("softmax", draw(st.integers(-rank, rank - 1)))
        elif kind == "norm":  # layer_norm or rms_norm, with or without the affine parameters
            step = ("norm", draw(st.sampled_from(("layer", "rms"))), cur[-1], draw(st.booleans()))
        elif kind == "sum" and rank >= 2:
            step = ("sum", draw(st.integers(0, rank - 1)), draw(st.booleans()), draw(
                st.sampled_from(("sum", "mean"))))
        elif kind in ("transpose", "view", "gram", "mask") and rank >= 2:
            step = (kind,)
        elif kind == "bias":  # broadcast along every axis but one, either operand first
            axis = draw(st.integers(0, rank - 1))
            shape_b = [d if i == axis else 1 for i, d in enumerate(cur)][draw(
                st.integers(0, axis)):]
            step = ("bias", tuple(shape_b), draw(st.booleans()))
        elif kind in ("cat", "slice") and rank >= 1:
            axis = draw(st.integers(0, rank - 1))
            step = (kind, axis) if kind == "cat" else (kind, axis, draw(
                st.integers(0, len(SLICES) - 1)))
        else:
            continue
        grown = trace([step], tuple(cur))[-1]
        if math.prod(grown) + math.prod(cur) * (grown[-1] if kind == "gram" else 1) > BUDGET:
            continue
        steps.append(step)
        cur = grown
    if not steps:  # every op drawn was skipped: one that always applies
        steps.append(("unary", draw(st.sampled_from(sorted(UNARY)))))
    program = (tuple(shape), steps, draw(st.integers(0, 2**16)))
    # second-call sizes for the dims no parameter fixes (0 and 1 stay: Dynamo specializes them)
    free = sorted({shape[i] for i in free_dims(program)} - {0, 1} - fixed_sizes(program))
    pool = [d for d in (*SIZES, *LARGE) if d > 1]
    remap = {}
    for size in free:
        choice = draw(st.sampled_from([d for d in pool if d not in remap.values()]))
        remap[size] = choice
    again = tuple(remap.get(d, d) if i in free_dims(program) else d for i, d in enumerate(shape))
    if max(math.prod(s) for s in trace(steps, again)) > BUDGET:
        again = tuple(shape)
    return (*program, again)


def free_dims(program) -> set[int]:
    """The input axes no parameter's shape depends on (their sizes may change between calls)."""
    shape, steps, _ = program[:3]
    return set(range(len(shape))) - _fixed_axes(shape, steps)


def fixed_sizes(program) -> set[int]:
    """The sizes of the input axes parameters fix (a free axis of the same size would share
    its symbol, so it is not changed either)."""
    shape, steps, _ = program[:3]
    return {shape[i] for i in _fixed_axes(shape, steps)}


def _fixed_axes(shape: tuple[int, ...], steps: list[tuple]) -> set[int]:
    sources = [{i} for i in range(len(shape))]  # input axes behind each current axis
    fixed: set[int] = set()
    for step in steps:
        kind = step[0]
        if kind in ("linear", "norm"):
            fixed |= sources[-1]
        elif kind == "bias":
            for axis, d in enumerate(step[1]):
                if d != 1:
                    fixed |= sources[len(sources) - len(step[1]) + axis]
        elif kind == "sum" and not step[2]:
            sources.pop(step[1])
        elif kind == "transpose":
            sources[-1], sources[-2] = sources[-2], sources[-1]
        elif kind == "view":
            sources[-2:] = [sources[-2] | sources[-1]]
        elif kind == "gram":
            sources[-1] = sources[-2]
    return fixed


class Program(torch.nn.Module):
    def __init__(self, steps, seed):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.steps = steps
        self.params = torch.nn.ParameterList()
        for step in steps:
            if step[0] == "linear":
                self.params.append(torch.nn.Parameter(torch.randn(step[2], step[1], generator=gen)
                                                      / step[1] ** 0.5))
                if step[3]:
                    self.params.append(torch.nn.Parameter(torch.randn(step[2], generator=gen)))
            elif step[0] == "norm" and step[3]:
                self.params.append(torch.nn.Parameter(torch.randn(step[2], generator=gen)))
                if step[1] == "layer":
                    self.params.append(torch.nn.Parameter(torch.randn(step[2], generator=gen)))
            elif step[0] == "bias":
                self.params.append(torch.nn.Parameter(torch.randn(step[1], generator=gen)))

    def forward(self, x):
        params = iter(self.params)
        for step in self.steps:
            kind = step[0]
            if kind == "linear":
                x = F.linear(x, next(params), next(params) if step[3] else None)
            elif kind == "unary":
                x = UNARY[step[1]](x)
            elif kind == "softmax":
                x = torch.softmax(x, step[1])
            elif kind == "norm":
                weight = next(params) if step[3] else None
                if step[1] == "layer":
                    bias = next(params) if step[3] else None
                    x = F.layer_norm(x, (x.shape[-1],), weight, bias, eps=NORM_EPS)
                else:
                    x = F.rms_norm(x, (x.shape[-1],), weight, eps=NORM_EPS)
            elif kind == "sum":
                x = (x.sum if step[3] == "sum" else x.mean)(step[1], keepdim=step[2])
            elif kind == "transpose":
                x = x.transpose(-1, -2)
            elif kind == "view":
                x = x.reshape(*x.shape[:-2], -1)
            elif kind == "cat":
                x = torch.cat([x, x * 0.5], step[1])
            elif kind == "slice":
                index = [slice(None)] * x.dim()
                index[step[1]] = slice(*SLICES[step[2]])
                x = x[tuple(index)]
            elif kind == "gram":
                x = x @ x.transpose(-1, -2)
            elif kind == "mask":  # a causal mask over the last two axes, built from arange
                rows = torch.arange(x.shape[-2], device=x.device)[:, None]
                x = x.masked_fill(torch.arange(x.shape[-1], device=x.device) > rows, 0.0)
            else:
                b = next(params)
                x = b + x if step[2] else x * b
        return x


# Every program the fuzzer ever failed on, checked on every run (static and dynamic).
REGRESSIONS = [
    # Three layer_norms after a GEMM: an epilogue keeping 5 row values across reductions, more
    # than the row programs hold; the building-blocks method proposed it and its build failed.
    ((1,), [("linear", 1, 2, False), ("norm", "layer", 2, True), ("norm", "layer", 2, True),
            ("norm", "layer", 2, True)], 0, (1,)),
    # dynamic=True: layer_norm without weight over a symbolic dim, a concatenation and a slice
    # as the output were refused (the slice of a symbolic dim, and a view of the input that
    # AOTAutograd remakes from the strides the backend returns).
    ((5, 7), [("norm", "layer", 7, False), ("cat", 0)], 1, (9, 7)),
    ((6, 3), [("slice", 0, 0)], 2, (11, 3)),
    # dynamic=True: a softmax over a view flattening two symbolic dims, as the output, ran
    # outside tilefold (the flattened size, a product, had no IR dim)
    ((30, 30), [("view",), ("softmax", 0)], 0, (2, 2)),
    ((4, 6, 5), [("view",), ("softmax", -1)], 3, (7, 2, 9)),
]
# Programs that cross the cache blocks and thread splits on every run (hypothesis' first
# examples are small): K past 1.5 KC, M past MC, rows split over threads, and under dynamic=True
# a second call at another large size through the same symbolic graph.
SIZED = [
    ((1100, 600), [("linear", 600, 300, True), ("norm", "layer", 300, False), ("softmax", -1)],
     7, (700, 600)),
    ((3, 600, 16), [("transpose",), ("linear", 600, 300, False), ("mask",), ("cat", 1),
                    ("norm", "rms", 300, True)], 8, (5, 600, 16)),
    ((2, 8, 5), [("gram",), ("softmax", -1), ("slice", 1, 2), ("sum", 1, False, "mean")], 9,
     (2, 700, 5)),
]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("program", REGRESSIONS, ids=lambda p: "-".join(s[0] for s in p[1]))
def test_torch_programs_that_once_failed(program, dynamic):
    check(program, dynamic)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("program", SIZED, ids=lambda p: "-".join(s[0] for s in p[1]))
def test_torch_programs_past_cache_blocks(program, dynamic):
    groups, native = check(program, dynamic)
    assert native == groups  # at these sizes the GEMMs and norms are native


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_random_torch_programs_match_pytorch_in_float64(dynamic):
    """Random programs against float64; of the groups holding a GEMM, a norm or a softmax, at
    least `NATIVE_FLOOR` run native kernels (the cost model may give a tiny one to extern)."""
    heavy = [0, 0]  # groups, native groups

    @settings(max_examples=EXAMPLES, deadline=None)
    @given(torch_programs())
    def run(program):
        for i, n in enumerate(check(program, dynamic)):
            heavy[i] += n

    run()
    print("HEAVY", dynamic, heavy)
    assert heavy[0] and heavy[1] >= NATIVE_FLOOR * heavy[0], heavy


def check(program, dynamic: bool) -> tuple[int, int]:
    """Run `program` compiled (twice, with other sizes, under `dynamic`) against float64;
    (groups holding a `HEAVY` op, those of them run by a native method)."""
    shape, steps, seed, again = program
    model = Program(steps, seed).eval()
    torch._dynamo.reset()
    report.REPORTS.clear()
    compiled = torch.compile(model, backend="tilefold", dynamic=dynamic,
                             options={"strict": True})
    calls = [shape, again] if dynamic else [shape]
    for n, size in enumerate(calls):
        x = torch.randn(size, generator=torch.Generator().manual_seed(seed + 1 + n))
        with torch.no_grad():
            got = compiled(x)
            want = Program(steps, seed).double().eval()(x.double())
        assert got.shape == want.shape and got.dtype == torch.float32
        # Reduced lengths add up along the chain; a norm (eps 1e-3) amplifies what comes in
        # by at most 1/sqrt(eps) < 32.
        sizes = trace(steps, size)
        length = 1 + sum(sizes[i][-1] if s[0] in ("linear", "gram") else
                         sizes[i][s[1]] if s[0] == "sum" else 0 for i, s in enumerate(steps))
        scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
        amplify = 32.0 ** sum(s[0] == "norm" for s in steps)
        bound = 16 * length * torch.finfo(torch.float32).eps * scale * amplify
        error = (got.double() - want).abs().max().item() if want.numel() else 0.0
        assert error <= bound, (error, bound, size, steps)
    graphs = report.reports()
    assert graphs and all(g.mode == "tilefold" for g in graphs)
    if dynamic and again != shape:
        # every op here takes symbolic sizes (a view's flattened size is a product of
        # symbols, a dim too): the second call reuses the graph
        assert len(graphs) == 1, ([g.symbolic_dims for g in graphs], shape, again, steps)
    methods = [method for g in graphs for names, method in g.groups()
               if HEAVY & set(names.split("+"))]
    return len(methods), sum(m.split(".")[0] not in ("extern", "interpreter") for m in methods)
