"""Frontend bugs that gave wrong shapes, crashes or silent PyTorch fallbacks, one test each.

Each compares torch.compile(backend="tilefold") under strict mode (the suite's default: no part
may fall back to PyTorch or the interpreter) with the computation done in float64.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from frontend_helpers import assert_native

from tilefold.frontend import report


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    report.REPORTS.clear()
    torch.manual_seed(0)


def _compiled(fn, *args):
    with torch.no_grad():
        return torch.compile(fn, backend="tilefold")(*args)


def test_llama_with_an_attention_mask_runs_fully_in_tilefold():
    """LLaMA's mask code makes `torch.tensor` constants that Dynamo lifts into the graph as
    get_attr nodes; they were a KeyError that sent the whole graph to PyTorch."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=256, vocab_size=512, max_position_embeddings=256)
    model = transformers.LlamaModel(config).eval()
    ids = torch.randint(0, 512, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # a padded sequence
    got = _compiled(model, ids, mask)[0]
    with torch.no_grad():
        want = copy.deepcopy(model).double()(ids, mask)[0]
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
    assert_native(report.reports(), {"matmul", "scaled_dot_product_attention", "rsqrt"})


def test_inference_tensor_weights_compile_and_follow_updates():
    """Weights made under torch.inference_mode keep no version counter: freezing them raised
    'Inference tensors do not track version counter'. They stay arguments, so an in-place
    update made in inference mode is seen."""
    with torch.inference_mode():
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                    torch.nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)

    def want() -> np.ndarray:
        double = copy.deepcopy(model).double()
        with torch.inference_mode():
            return double(x.double()).numpy()

    compiled = torch.compile(model, backend="tilefold")
    with torch.inference_mode():
        np.testing.assert_allclose(compiled(x).numpy(), want(), rtol=1e-5, atol=1e-5)
        model[0].weight.mul_(-0.5)
        np.testing.assert_allclose(compiled(x).numpy(), want(), rtol=1e-5, atol=1e-5)
    assert_native(report.reports(), {"matmul"})


@pytest.mark.parametrize("name, fn, shapes", [
    ("sum", lambda x: x.sum(), [(3, 4)]),
    ("sum of a 0-d tensor over dim 0", lambda x: x.sum(0), [()]),
    ("exp of a 0-d tensor", torch.exp, [()]),
    ("dot product", torch.matmul, [(7,), (7,)]),
])
def test_zero_dim_results_stay_zero_dim(name, fn, shapes):
    """0-d results came back with shape [1] (np.ascontiguousarray makes 0-d arrays 1-d), and a
    reduction over dim 0 of a 0-d tensor was left to PyTorch."""
    args = [torch.randn(s) for s in shapes]
    got = _compiled(fn, *args)
    want = fn(*(a.double() for a in args))
    assert got.shape == want.shape == torch.Size([]), name
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    assert [g.mode for g in report.reports()] == ["tilefold"]


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax])
@pytest.mark.parametrize("dim", [0, -1])
def test_softmax_of_a_zero_dim_tensor_runs(fn, dim):
    """softmax/log_softmax of a 0-d tensor raised ZeroDivisionError (`dim %= rank`)."""
    x = torch.randn(()) * 5
    got = _compiled(lambda t: fn(t, dim), x)
    want = fn(x.double(), dim)
    assert got.shape == torch.Size([])
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-7)


@pytest.mark.parametrize("a, b", [((5, 0), (0, 10)), ((5, 5, 0), (0, 5))])
def test_matmul_over_an_empty_inner_dim_is_zeros(a, b):
    """A product summing over nothing is zeros; the backend returned whatever memory held."""
    x, y = torch.randn(a), torch.randn(b)
    got = _compiled(torch.matmul, x, y)
    assert got.shape == torch.matmul(x, y).shape
    np.testing.assert_array_equal(got.numpy(), np.zeros(got.shape, np.float32))


@pytest.mark.parametrize("shape", [(20,), (1, 0, 3), (3, 17)])
def test_comparisons_of_bools_compile(shape):
    """bitwise_not of a bool tensor is `x == false`: comparing i1 lanes emitted `fcmp`, which
    LLVM rejects, so the graph ran on the reference interpreter (an error under strict)."""
    x = torch.rand(shape)
    got = _compiled(lambda t: torch.bitwise_not(t > 0.5) != (t < 0.2), x)
    np.testing.assert_array_equal(got.numpy(), ~(x.numpy() > 0.5) != (x.numpy() < 0.2))
