"""torch.compile(dynamic=True): programs that compile with static shapes compile with symbolic
ones too, strict, and match float64 PyTorch at every size they are called with.

Each case is called at three sizes; a case whose ops all take symbolic sizes must not be traced
again for the later ones (one graph). Sizes an op needs as numbers it cannot get symbolically (a
strided slice's length, a floor division) are specialized with a guard: those cases may trace
again, and say so. Outputs that view the input stay views of it (AOTAutograd remakes them from
what the backend returns).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.tolerances import tolerance
from tilefold.frontend import report

SIZES = [(5, 7), (6, 9), (11, 4)]

# name -> (function of x, whether it stays one graph across SIZES)
CASES = {
    "layer_norm_without_weight": (lambda x: F.layer_norm(x, (x.shape[-1],)), True),
    "rms_norm_without_weight": (lambda x: F.rms_norm(x, (x.shape[-1],), eps=1e-3), True),
    "cat_output": (lambda x: torch.cat([x, x * 2], dim=-1), True),
    "cat_then_reshape": (lambda x: torch.stack([x, x + 1], 0).reshape(-1, x.shape[-1]), True),
    "slice_output": (lambda x: x[:, 1:], True),
    "slice_inside": (lambda x: x[1:-1] * 2, True),
    "last_columns": (lambda x: x[..., -3:] + 1, True),
    "narrow": (lambda x: x.narrow(-1, 1, 2).exp(), True),
    "split_even": (lambda x: torch.split(x, [2, x.shape[0] - 2])[1] * 3, True),
    "chunk": (lambda x: x.chunk(2, dim=0)[1] * 3, False),  # the chunk count is a guard
    "strided_slice": (lambda x: x[::2] + 1, False),  # (n+1)//2 rows: specialized
    "select_last": (lambda x: x[-1] * 2, True),
    "causal_mask": (lambda x: x.masked_fill(
        torch.arange(x.shape[-1])[None, :] > torch.arange(x.shape[-2])[:, None], 0.0), True),
    "zeros_of_a_size": (lambda x: torch.zeros(x.shape[0], 4) + x.sum(-1, keepdim=True), True),
    "expand": (lambda x: x[:, None, :].expand(-1, 3, -1) * 1.5, True),
    "full_like": (lambda x: torch.full_like(x, 3.0) - x, True),
    "tril": (lambda x: torch.tril(x, 1), True),
    # flattened sizes are products of symbols (`?(s0*s1)`, `?(3*s0)`): dims of their own
    "flatten_softmax": (lambda x: x.view(-1).softmax(0), True),
    "flatten_a_static_dim": (lambda x: x[:, :3].reshape(-1) * 2, True),
    "flatten_and_split": (lambda x: (x.reshape(-1) + 1).view(x.shape[1], x.shape[0]).t(), True),
}


def _run(fn, dynamic=True):
    torch._dynamo.reset()
    report.REPORTS.clear()
    return torch.compile(fn, backend="tilefold", dynamic=dynamic, options={"strict": True})


@pytest.mark.parametrize("name", sorted(CASES))
def test_programs_compile_with_symbolic_sizes(name):
    fn, one_graph = CASES[name]
    compiled = _run(fn)
    gen = torch.Generator().manual_seed(0)
    for shape in SIZES:
        x = torch.randn(shape, generator=gen)
        got, want = compiled(x), fn(x.double())
        assert got.shape == want.shape
        torch.testing.assert_close(got.double(), want, **tolerance("f32", shape[-1]))
    graphs = report.reports()
    assert all(g.mode == "tilefold" for g in graphs)
    assert graphs[0].symbolic_dims, "the first graph is already symbolic"
    if one_graph:
        assert len(graphs) == 1, [g.symbolic_dims for g in graphs]


def test_training_over_flattened_rows_compiles_once():
    """A linear over a [b, t, k] batch flattened to rows saves its input [b*t, k] for the weight
    gradient: with the product a dim, the forward and the backward graph each compile once for
    every (b, t), and the gradients match float64 at each."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 6)
    oracle = torch.nn.Linear(8, 6).double()
    oracle.load_state_dict(model.state_dict())

    def fn(layer, x):
        rows = F.gelu(layer(x.reshape(-1, x.shape[-1])))
        return rows.view(x.shape[0], x.shape[1], -1).softmax(1)

    compiled = _run(lambda x: fn(model, x))
    gen = torch.Generator().manual_seed(1)
    for b, t in [(3, 5), (4, 7), (6, 2)]:
        x = torch.randn(b, t, 8, generator=gen, requires_grad=True)
        out = compiled(x)
        g = torch.randn(out.shape, generator=gen)
        out.backward(g)
        x64 = x.detach().double().requires_grad_(True)
        fn(oracle, x64).backward(g.double())
        for got, want in [(x.grad, x64.grad), (model.weight.grad, oracle.weight.grad),
                          (model.bias.grad, oracle.bias.grad)]:
            torch.testing.assert_close(got.double(), want, **tolerance("f32", b * t * 8))
        model.zero_grad()
        oracle.zero_grad()
    graphs = report.reports()
    assert all(g.mode == "tilefold" and not g.fallback for g in graphs)
    assert sorted(g.graph.rsplit(" ", 1)[-1] for g in graphs) == ["backward", "forward"], [
        (g.graph, g.symbolic_dims) for g in graphs]


@pytest.mark.parametrize("view", [lambda x: x[:, 1:], lambda x: x[2:], lambda x: x.t(),
                                  lambda x: x[1], lambda x: x[:, None, :].expand(-1, 2, -1)],
                         ids=["columns", "rows", "transpose", "select", "expand"])
def test_outputs_that_view_the_input_are_views_of_it(view):
    """AOTAutograd remakes such an output from the input with the strides and offset of the
    tensor the backend returned; a fresh result gave the input's first elements."""
    compiled = _run(view)
    for shape in SIZES:
        x = torch.randn(shape)
        got = compiled(x)
        assert torch.equal(got, view(x))
        assert got.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


@pytest.mark.parametrize("case", ["alpha", "addmm", "softplus", "norm_order", "fill", "index",
                                  "arange_start"])
def test_python_numbers_that_dynamic_makes_symbolic(case):
    """With dynamic=True Dynamo passes Python ints as SymInts: a number used as data is read at
    run time (an `i64[]` argument, negative ones too); one an attribute needs (softplus' beta,
    a norm's order) is specialized with a guard, so another value traces again and is right."""
    fns = {
        "alpha": lambda x, n: torch.add(x, x, alpha=n),
        "addmm": lambda x, n: torch.addmm(x, x, x.t()[:, : x.shape[1]], beta=n, alpha=n),
        "softplus": lambda x, n: F.softplus(x, beta=n, threshold=2),
        "norm_order": lambda x, n: torch.linalg.vector_norm(x, ord=n, dim=-1),
        "fill": lambda x, n: x + torch.full((x.shape[-1],), n),
        "index": lambda x, n: x[n] * 2,
        "arange_start": lambda x, n: x + torch.arange(n, n + x.shape[-1]),
    }
    fn = fns[case]
    compiled = _run(fn)
    for shape, n in [((5, 5), 3), ((6, 6), 4), ((7, 7), -2 if case == "index" else 2)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x, n).double(), fn(x.double(), n),
                                   **tolerance("f32", shape[-1], 10.0))
    assert all(g.mode == "tilefold" for g in report.reports())


def test_a_symbolic_graph_called_on_the_same_tensors_replays_and_follows_them():
    """A size input's array stays the same object while its value does, so a symbolic graph
    called again on the same tensors replays its recorded kernels (the GEMM epilogue's row
    kernel takes its row count at run time); new contents or a new number are computed right."""
    def fn(x, n):
        return torch.add(F.gelu(x @ x.t()), x.sum(-1, keepdim=True), alpha=n)

    compiled = _run(fn)
    compiled(torch.randn(5, 7), 3)  # the first graph may be static; this one is symbolic
    x = torch.randn(9, 6)
    for n in (2, 2, 2, -3, -3, -3):
        x.copy_(torch.randn(9, 6))  # same memory, new contents
        torch.testing.assert_close(compiled(x, n).double(), fn(x.double(), n),
                                   **tolerance("f32", 6, 10.0))
    plans = [p for g in report.reports() for e in g.executors
             for p in e.runner.run.compiled._plans.values()]
    assert all(g.mode == "tilefold" for g in report.reports())
    assert any(p.replay is not None for p in plans), "the symbolic graph never replayed"


def test_a_symbolic_graph_holds_its_linear_weights_packed():
    """Dynamo specializes sizes 0 and 1, so its symbolic rows are never one row: a linear's
    constant weight is packed once (as with static rows), not per call; every size (rows
    below a micro-tile, primes, several MC blocks) matches float64."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 72), torch.nn.GELU()).eval()
    ref = copy.deepcopy(model).double()
    compiled = _run(model, dynamic=None)  # Dynamo's default: symbolic after the first shape
    with torch.no_grad():
        for batch, tokens in ((3, 5), (2, 2), (3, 13), (5, 61)):
            x = torch.randn(batch, tokens, 40)
            want = ref(x.double())
            torch.testing.assert_close(compiled(x).double(), want, **tolerance("f32", 40, 4.0))
    symbolic = [g for g in report.reports() if g.symbolic_dims]
    gemms = [d.winner.config for g in symbolic for d in g.decisions()
             if d.winner.method == "blocks.gemm"]
    assert symbolic and gemms and all(c["prepack"] for c in gemms), gemms
