"""ATen lowering rules, op by op: each traced function must lower and match PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from frontend_helpers import check, lower

from tests.tolerances import assert_close
from tilefold.errors import TilefoldError, UnsupportedError
from tilefold.frontend import report
from tilefold.frontend.lowering import RULES, lowering
from tilefold.ir import interpret

torch.manual_seed(0)
X = torch.randn(2, 3, 8)
W = torch.randn(16, 8)
B = torch.randn(16)
IDS = torch.tensor([[1, 3, 0], [2, 2, 5]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])

CASES = {  # name -> (function, example inputs)
    "linear": (lambda x, w, b: F.linear(x, w, b), (X, W, B)),
    "addmm": (lambda b, x, w: torch.addmm(b, x, w.t()), (B, X[0], W)),
    "bmm": (lambda x: torch.bmm(x, x.transpose(1, 2)), (X,)),
    "matmul": (lambda x, w: x @ w.t(), (X, W)),
    "gelu": (lambda x: F.gelu(x), (X,)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), (X,)),
    "softplus": (lambda x: F.softplus(x) + F.softplus(x * 9, beta=0.5, threshold=3.0), (X,)),
    "unary": (lambda x: torch.tanh(x).exp() + torch.sigmoid(x) * F.silu(x) - F.relu(x), (X,)),
    "rsqrt_pow": (lambda x: torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * x, (X,)),
    "softmax": (lambda x: torch.softmax(x, -1) + torch.log_softmax(x, 1), (X,)),
    "layer_norm": (lambda x: F.layer_norm(x, (8,), torch.ones(8) * 2, torch.zeros(8)), (X,)),
    "layer_norm_plain": (lambda x: F.layer_norm(x, (3, 8)), (X,)),
    "rms_norm": (lambda x: F.rms_norm(x, (8,), torch.full((8,), 0.5), 1e-6), (X,)),
    "reductions": (lambda x: (x.sum(1), x.mean(-1, keepdim=True), x.amax(0), x.sum()), (X,)),
    "normalize": (lambda x: F.normalize(x, p=2, dim=-1), (X,)),
    "where_masked_fill": (
        lambda x: torch.where(x > 0, x, 0.0) + x.masked_fill(x < -1, -5.0), (X,),
    ),
    "compare_cast": (lambda x: (x >= 0.5).to(torch.float32) + (x != 0).int(), (X,)),
    "embedding": (lambda w, i: F.embedding(i, w), (W, IDS)),
    "views": (lambda x: x.view(2, 3, 2, 4).permute(0, 2, 1, 3).reshape(2, 2, 12), (X,)),
    "transpose_expand": (lambda x: x.transpose(0, 1).unsqueeze(1).expand(3, 4, 2, 8), (X,)),
    "slice_select": (lambda x: x[:, 1:3, ::2] * x[:, :2, 1::2][..., None, 0], (X,)),
    "cat_split": (lambda x: torch.cat(x.split([3, 5], -1)[::-1], -1), (X,)),
    "squeeze": (lambda x: x[:, :1].squeeze(1) + x[:, :1].squeeze(), (X,)),
    "arange_full": (
        lambda x: x + torch.arange(8) + torch.full((3, 8), 2.0) + torch.ones_like(x), (X,),
    ),
    "tril": (lambda x: torch.tril(x) - torch.triu(x, 1), (X,)),
    "gather_index": (lambda x, i: torch.gather(x[0], 1, i % 3) + x[0][i[0] % 3][:2, :3], (X, IDS)),
    "mean_pool": (
        lambda h, m: (h * m.unsqueeze(-1).float()).sum(1) / m.sum(1, keepdim=True).clamp(min=1e-9),
        (X, MASK),
    ),
    "sdpa_mask": (
        lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m.bool()[:, None, None]),
        (torch.randn(2, 4, 3, 8), MASK),
    ),
    "sdpa_causal_scale": (
        lambda q: F.scaled_dot_product_attention(q, q * 2, q, is_causal=True, scale=0.3),
        (torch.randn(2, 4, 3, 8),),
    ),
    "sdpa_float_mask": (
        lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m), (
            torch.randn(2, 4, 3, 8), torch.randn(3, 3)),
    ),
    "sdpa_gqa": (
        lambda q, k: F.scaled_dot_product_attention(q, k, k, enable_gqa=True),
        (torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8)),
    ),
    "integer_math": (lambda i: (i * 3 + 1) // 2 - torch.div(i, 2, rounding_mode="trunc"), (IDS,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_matches_pytorch(name):
    fn, args = CASES[name]
    check(fn, *args)


def test_attention_stays_one_op():
    fn, args = CASES["sdpa_mask"]
    module = lower(fn, *args)
    names = [op.name for op in module.walk()]
    assert names.count("scaled_dot_product_attention") == 1 and "softmax" not in names


def test_symbolic_sizes_lower_slices_and_flattened_rows():
    """A symbolic-length slice of a constant becomes gather(arange); view(-1, K) @ W stays 3-D."""
    table = torch.randn(64, 8)

    def fn(x, w):
        rows = x.view(-1, 8) @ w.t()
        return rows.view(x.shape[0], x.shape[1], 16) + table[: x.shape[1], :2].sum(-1, True)

    seq = torch.export.Dim("seq", max=64)
    module = check(fn, X, W, dynamic_shapes=({1: seq}, None))
    assert not module["main"].args[0].type.is_static
    assert {"arange", "gather"} <= {op.name for op in module.walk()}


def test_an_exported_output_flattened_from_symbolic_sizes_has_a_product_dim():
    """A result of the size 2*?seq (rows flattened from [2,?seq,8]) is a derived dim of the
    module, evaluated at each length it runs at."""
    def fn(x):
        return F.layer_norm(x.view(-1, 8), (8,))

    seq = torch.export.Dim("seq", max=64)
    module = check(fn, X, dynamic_shapes=({1: seq},))
    length = module["main"].args[0].type.shape[1]
    assert [str(t) for t in module["main"].result_types] == [f"f32[?(2*{length.name}),8]"]
    for length in (1, 5, 17):
        x = torch.randn(2, length, 8)
        (got,) = interpret(module, x.numpy())
        assert_close(got, fn(x.double()).numpy(), dtype="f32", reduced=8)


CUMSUM_INPUTS = {  # name -> a random input (PyTorch sums bools and integers in i64)
    "f32": torch.randn(3, 4, 5),
    "f64": torch.randn(3, 4, 5, dtype=torch.float64) * 1e3,
    "i32": torch.randint(-2**30, 2**30, (3, 4, 5), dtype=torch.int32),
    "i64": torch.randint(-2**40, 2**40, (3, 4, 5)),
    "bool": torch.rand(3, 4, 5) < 0.5,
    "empty_axis": torch.randn(3, 0, 5),
}


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("name", sorted(CUMSUM_INPUTS))
def test_cumsum_matches_eager_and_float64_numpy(name, dim):
    """cumsum lowers (checked on the reference) and compiles whole in strict mode: the extern
    method runs it through NumPy; integer sums are exact, float sums within rounding."""
    x = CUMSUM_INPUTS[name]
    fn = lambda t: torch.cumsum(t, dim)  # noqa: E731
    check(fn, x)
    torch._dynamo.reset()
    report.REPORTS.clear()
    got = torch.compile(fn, backend="tilefold", options={"strict": True})(x)
    want = fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    (graph,) = report.reports()
    assert graph.mode == "tilefold"
    assert dict(graph.groups())["cumsum"].startswith("extern.")  # a NumPy call
    source = x.numpy()
    if source.dtype.kind == "f":
        exact = np.cumsum(source.astype(np.float64), axis=dim)
        scale = np.cumsum(np.abs(source.astype(np.float64)), axis=dim)
        eps = np.finfo(source.dtype).eps
        assert np.all(np.abs(got.numpy() - exact) <= 2 * eps * scale)
        torch.testing.assert_close(got, want)
    else:
        np.testing.assert_array_equal(got.numpy(), np.cumsum(source.astype(np.int64), axis=dim))


def test_cumsum_of_a_zero_dim_tensor_is_itself():
    x = torch.tensor(2.5)
    check(lambda t: torch.cumsum(t, 0) + torch.cumsum(t, -1), x)


def test_float_math_on_integers_runs_as_numpy_calls_in_strict_mode():
    """T5's position buckets: log and div of integers cast to f32. Native kernels take no i64
    data, so extern runs the group, with NumPy's f32 div and log (not the f64 reference)."""
    fn = lambda i, x: torch.log(i.float() / 7.0 + 1) / x  # noqa: E731
    torch._dynamo.reset()
    report.REPORTS.clear()
    compiled = torch.compile(fn, backend="tilefold", options={"strict": True})
    for n in (5, 7):  # the second length traces symbolically
        i, x = torch.randint(0, 1000, (3, n)), torch.rand(3, n) + 0.5
        want = np.log(i.numpy() / 7.0 + 1) / x.numpy().astype(np.float64)
        np.testing.assert_allclose(compiled(i, x).numpy(), want, rtol=1e-6)
    for graph in report.reports():
        assert graph.mode == "tilefold"
        assert dict(graph.groups())["cast+div+add+log+div"].startswith("extern.")


def test_unsupported_op_names_the_op_and_reason():
    with pytest.raises(UnsupportedError, match=r"aten\.cumprod\.default.*no lowering rule"):
        lower(lambda x: torch.cumprod(x, 0), X)


def test_duplicate_rule_is_rejected():
    target = torch.ops.aten.exp.default
    assert target in RULES
    with pytest.raises(TilefoldError, match="two lowering rules"):
        lowering(target)(lambda ctx, x: x)


def test_a_growing_cache_joins_and_slices_symbolic_lengths():
    """cat along a symbolic dim gives ?(s+1); its last rows slice by [-k:]; a size used as a
    number reads it at run time (dim_size); each checked again at another length."""

    def fn(past, new):
        kv = torch.cat([past, new], 1)
        return kv, kv[:, -3:] * 2 + kv.shape[1]

    past = torch.export.Dim("past", min=3, max=64)
    module = check(fn, torch.randn(2, 5, 4), torch.randn(2, 1, 4),
                   dynamic_shapes=({1: past}, None))
    fn_ir = module["main"]
    (sym,) = fn_ir.args[0].type.symbols
    assert str(fn_ir.outputs[0].type.shape[1]) == f"?({sym}+1)"
    assert "dim_size" in {op.name for op in module.walk()}
    for length in (3, 40):
        args = torch.randn(2, length, 4), torch.randn(2, 1, 4)
        got = interpret(module, *(a.numpy() for a in args))
        for g, w in zip(got, fn(*args), strict=True):
            assert_close(g, w.numpy(), dtype="f32")
