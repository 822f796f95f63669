"""Differential fuzzing of training through the PyTorch path: the random torch programs of
`test_torch_programs.py` (linear layers, activations, softmax, norms, reductions, views,
slices, concatenation, causal masks, broadcasting parameters) with an input that requires grad
and every weight a parameter, compiled with torch.compile(backend="tilefold"), strict: the
forward and the backward graph AOTAutograd hands to the backend both run in tilefold. The
output's gradient is random (`out.backward(g)`); the input's and every parameter's gradients
must match the same program run by PyTorch in float64, with static shapes and with
`dynamic=True` (a second call at other sizes for the dims no weight fixes; it may trace again,
see `check_backward`).

Sizes are the forward fuzzer's, large ones included (past a GEMM's K and M cache blocks, rows
split over threads), and `SIZED` crosses them on every run. Of the groups holding a GEMM, a
norm or a softmax, forward and backward, at least `NATIVE_FLOOR` run native kernels.
`TILEFOLD_FUZZ_EXAMPLES` scales the count as for the other fuzzers.
"""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import assume, given, settings
from test_torch_programs import (
    BUDGET,
    EXAMPLES,
    HEAVY,
    NATIVE_FLOOR,
    SIZED,
    Program,
    torch_programs,
    trace,
)

from tilefold.frontend import report

torch = pytest.importorskip("torch")

VIEWS = ("transpose", "view", "slice")
# Programs the backward fuzzer failed on, checked on every run (static and dynamic).
REGRESSIONS = [
    # a view of the input alone: AOTAutograd compiles no forward and backward pair for it
    ((1, 1), [("transpose",)], 0, (1, 1)),
    # dynamic=True: the gradient of a slice from the end of a symbolic dim (`slice_scatter`
    # from -2) was left to PyTorch
    ((6, 7), [("linear", 7, 5, False), ("slice", 0, 2)], 3, (11, 7)),
    # a softmax of two elements: its gradient, far smaller than the output's gradient it is
    # a difference of, held to a bound in units of the smaller one
    ((300,), [("softmax", 0)], 11, (2,)),
    # dynamic=True: a softmax over a view flattening two symbolic dims, as the output, ran
    # outside tilefold (the flattened size, a product, had no IR dim)
    ((30, 30), [("view",), ("softmax", 0)], 0, (2, 2)),
]


def reduced_lengths(steps: list[tuple], shape: tuple[int, ...]) -> int:
    """1 + the lengths of every sum a gradient element's error may pass through: the forward's
    (a linear's K, a gram's K, a sum's axis) and the backward's (a linear's input gradient
    sums over its N outputs and its weight gradient over the rows; a norm's over its last dim
    and, for its affine parameters, the rows; a softmax's over its axis; a broadcast
    parameter's over the elements sharing it; a gram's input gradient over its M rows)."""
    sizes = trace(steps, shape)
    total = 1
    for i, step in enumerate(steps):
        cur, out = sizes[i], sizes[i + 1]
        rows = math.prod(cur[:-1])
        kind = step[0]
        if kind == "linear":
            total += cur[-1] + out[-1] + rows
        elif kind == "gram":
            total += cur[-1] + 2 * cur[-2]
        elif kind == "sum":
            total += cur[step[1]]
        elif kind == "norm":
            total += cur[-1] + rows
        elif kind == "softmax":
            total += cur[step[1]]
        elif kind == "bias":
            total += math.prod(out) // max(1, math.prod(step[1]))
        elif kind == "cat":
            total += 2
    return total


def check_backward(program, dynamic: bool) -> tuple[int, int]:
    """Run `program` forward and backward compiled (twice, with other sizes, under `dynamic`)
    against float64; (groups holding a `HEAVY` op, those of them run by a native method)."""
    shape, steps, seed, again = program
    model = Program(steps, seed)
    oracle = copy.deepcopy(model).double()
    torch._dynamo.reset()
    report.REPORTS.clear()
    compiled = torch.compile(model, backend="tilefold", dynamic=dynamic,
                             options={"strict": True})
    calls = [shape, again] if dynamic else [shape]
    for n, size in enumerate(calls):
        model.zero_grad(set_to_none=True)
        oracle.zero_grad(set_to_none=True)
        gen = torch.Generator().manual_seed(seed + 1 + n)
        x = torch.randn(size, generator=gen).requires_grad_(True)
        out = compiled(x)
        weights = torch.randn(out.shape, generator=gen)
        out.backward(weights)
        x64 = x.detach().double().requires_grad_(True)
        oracle(x64).backward(weights.double())
        got = [("input", x.grad)] + [(name, p.grad) for name, p in model.named_parameters()]
        want = [x64.grad] + [p.grad for p in oracle.parameters()]
        # The forward fuzzer's rule over the forward's and the backward's reduced lengths,
        # in units of the size of the terms the backward sums: the largest gradient element,
        # or the output's gradient where that is larger (a softmax's gradient is a difference
        # of terms as large as it, which cancel); a norm (eps 1e-3) amplifies what comes in by
        # at most 1/sqrt(eps) < 32.
        scale = max([float(w.abs().max()) for w in want if w.numel()]
                    + [float(weights.abs().max()) if weights.numel() else 0.0])
        amplify = 32.0 ** sum(s[0] == "norm" for s in steps)
        bound = (16 * reduced_lengths(steps, size) * torch.finfo(torch.float32).eps
                 * max(scale, 1e-30) * amplify)
        for (name, g), w in zip(got, want, strict=True):
            assert g is not None, f"{name}: no gradient ({size}, {steps})"
            assert g.shape == w.shape and g.dtype == torch.float32, (name, g.shape, w.shape)
            error = (g.double() - w).abs().max().item() if w.numel() else 0.0
            assert error <= bound, (name, error, bound, size, steps)
    graphs = report.reports()
    parts = [g.graph.rsplit(" ", 1)[-1] for g in graphs]
    if not all(s[0] in VIEWS for s in steps):  # views of the input alone: nothing to compute,
        # AOTAutograd replays them on the output and autograd differentiates them
        assert "forward" in parts and "backward" in parts, [g.graph for g in graphs]
    assert all(g.mode == "tilefold" and not g.fallback for g in graphs), [
        g.format() for g in graphs]
    if dynamic and again != shape:  # every op takes symbolic sizes, a saved activation
        # flattened over two symbolic dims (a linear's input [b*t, k], kept for its weight
        # gradient) too: the second call reuses the forward and the backward graph
        assert parts.count("forward") <= 1 and parts.count("backward") <= 1, [
            (g.graph, g.symbolic_dims) for g in graphs]
    methods = [method for g in graphs for names, method in g.groups()
               if HEAVY & set(names.split("+"))]
    return len(methods), sum(m.split(".")[0] not in ("extern", "interpreter") for m in methods)


@pytest.fixture(autouse=True)
def fresh():
    yield
    torch._dynamo.reset()
    report.REPORTS.clear()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("program", REGRESSIONS, ids=lambda p: "-".join(s[0] for s in p[1]))
def test_backward_of_programs_that_once_failed(program, dynamic):
    check_backward(program, dynamic)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("program", SIZED, ids=lambda p: "-".join(s[0] for s in p[1]))
def test_backward_past_cache_blocks(program, dynamic):
    groups, native = check_backward(program, dynamic)
    assert groups and native >= NATIVE_FLOOR * groups, (groups, native)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_random_programs_backward_match_pytorch_in_float64(dynamic):
    """Random programs' gradients against float64; of the groups holding a GEMM, a norm or a
    softmax (forward and backward), at least `NATIVE_FLOOR` run native kernels."""
    heavy = [0, 0]  # groups, native groups

    @settings(max_examples=EXAMPLES, deadline=None)
    @given(torch_programs())
    def run(program):
        # the generator bounds the values' sizes, not a linear's weight (K x N): a flattened
        # 90000-wide input would draw a 32 GB one
        assume(sum(s[1] * s[2] for s in program[1] if s[0] == "linear") <= BUDGET)
        for i, n in enumerate(check_backward(program, dynamic)):
            heavy[i] += n

    run()
    print(f"backward fuzzer ({'dynamic' if dynamic else 'static'}): {heavy[1]} of {heavy[0]} "
          "heavy groups native")
    assert heavy[0] and heavy[1] >= NATIVE_FLOOR * heavy[0], heavy
