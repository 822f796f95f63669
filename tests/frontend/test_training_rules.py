"""The lowering rules a training step's backward graph needs beyond the forward's: `any` over
dims (the math attention's fully-masked-row test), `empty*` (a buffer autograd fills with
full_like), the accumulating `index_put` (an embedding's gradient), the one-hot `scatter`
(nll_loss's) and `constant_pad_nd` (GPT-2's shifted labels), each against NumPy or PyTorch."""

from __future__ import annotations

import numpy as np
import torch
from frontend_helpers import lower

from tilefold.ir import interpret


def test_any_over_dims_matches_numpy() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4, 5))
    x[rng.random(x.shape) < 0.6] = 0.0
    x[1, 2] = 0.0  # a row with no nonzero element
    module = lower(lambda t: (torch.any(t, dim=2), torch.any(t, dim=(0, 2), keepdim=True),
                              torch.any(t)), torch.from_numpy(x).float())
    got = interpret(module, x.astype(np.float32))
    nonzero = x != 0
    want = (nonzero.any(2), nonzero.any((0, 2), keepdims=True), nonzero.any())
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.bool_
        np.testing.assert_array_equal(g, w)


def test_a_filled_empty_tensor_matches_numpy() -> None:
    x = np.random.default_rng(8).standard_normal((4, 6)).astype(np.float32)

    def fill(t):
        return torch.full_like(torch.empty_like(t), 2.5) * t + torch.empty(4, 6).fill_(1.5)

    (got,) = interpret(lower(fill, torch.from_numpy(x)), x)
    np.testing.assert_allclose(got, 2.5 * x.astype(np.float64) + 1.5, rtol=1e-6, atol=1e-6)


def test_accumulating_index_put_sums_every_repeated_index() -> None:
    """An embedding's gradient: rows of `values` added into the rows their ids name, repeats
    summed (a last-write-wins put would keep one of them), compiled and interpreted."""
    from tilefold import compile as tilefold_compile

    rng = np.random.default_rng(9)
    table = rng.standard_normal((6, 5)).astype(np.float32)
    ids = np.array([4, 1, 4, 4, 0, 1], dtype=np.int64)
    rows = rng.standard_normal((6, 5)).astype(np.float32)
    module = lower(lambda t, i, v: torch.index_put(t, (i,), v, accumulate=True),
                   *(torch.from_numpy(a) for a in (table, ids, rows)))
    want = table.astype(np.float64)
    np.add.at(want, ids, rows.astype(np.float64))
    for got in (interpret(module, table, ids, rows)[0],
                tilefold_compile(module)(table, ids, rows)[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_embedding_backward_lowers_to_an_accumulating_put() -> None:
    ids = np.array([[3, 0, 3], [2, 3, 0]], dtype=np.int64)
    grad = np.random.default_rng(10).standard_normal((2, 3, 4)).astype(np.float32)
    module = lower(lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, 5, -1, False),
                   torch.from_numpy(grad), torch.from_numpy(ids))
    want = np.zeros((5, 4))
    np.add.at(want, ids.reshape(-1), grad.reshape(-1, 4).astype(np.float64))
    (got,) = interpret(module, grad, ids)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_one_hot_scatter_matches_torch() -> None:
    """nll_loss's backward: a value written at each row's target column; and scatter.src."""
    x = np.random.default_rng(11).standard_normal((4, 7)).astype(np.float32)
    target = np.array([[6], [0], [3], [6]], dtype=np.int64)
    src = np.arange(4, dtype=np.float32).reshape(4, 1) + 10
    fns = [lambda t, i, s: torch.scatter(t, 1, i, -1.0),
           lambda t, i, s: torch.scatter(t, 1, i, s),
           lambda t, i, s: torch.scatter(t.T, 0, i.T, s.T)]
    args = [torch.from_numpy(a) for a in (x, target, src)]
    for fn in fns:
        (got,) = interpret(lower(fn, *args), x, target, src)
        np.testing.assert_array_equal(got, fn(*args).numpy())


def test_constant_pad_matches_torch() -> None:
    """GPT-2's shifted labels pad with -100; negative pads cut."""
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    for pad in [(0, 1), (2, 0, 1, 1), (-1, 2), (1, -2, 0, 0, 1, 0)]:
        fn = lambda t, pad=pad: torch.nn.functional.pad(t, pad, value=-100)  # noqa: E731
        (got,) = interpret(lower(fn, torch.from_numpy(x)), x)
        np.testing.assert_array_equal(got, fn(torch.from_numpy(x)).numpy())


def test_training_var_mean_decomposition_matches_torch() -> None:
    """`training._var_mean` (batch norm's statistics) against torch.var_mean in float64, for
    every way of naming the dims (None and [] reduce them all) and both corrections."""
    from tilefold.frontend.training import _var_mean

    x = torch.randn(4, 5, 6, dtype=torch.float64)
    for dim in (None, [], [0], [0, 2], [-1]):
        for correction in (0, 1):
            for keepdim in (False, True):
                got = _var_mean(x, dim, correction=correction, keepdim=keepdim)
                want = torch.var_mean(x, dim, correction=correction, keepdim=keepdim)
                for g, w in zip(got, want, strict=True):
                    torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
