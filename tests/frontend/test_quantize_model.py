"""`tilefold.quantize(model, ...)`: linear layers become weight-only layers holding codes and
scales; the model runs in eager (dequantizing) and, compiled by tilefold, runs the weight-only
GEMM on the very same codes: answers against float64 on the dequantized weights, greedy tokens
against eager on the quantized model, strict."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilefold
from tests.frontend.test_generate import _generate, _graphs, _model, _prompt
from tests.tolerances import assert_close
from tilefold.errors import DTypeError, ShapeError
from tilefold.frontend import report
from tilefold.frontend.quantize import WeightOnlyLinear

RNG = np.random.default_rng(3)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.SiLU(),
                               torch.nn.Linear(128, 96, bias=False), torch.nn.Linear(96, 8))


def _weights(layer: WeightOnlyLinear) -> np.ndarray:
    codes, scale = layer.codes.numpy().astype(np.float64), layer.scale.numpy()
    return codes * np.repeat(scale.astype(np.float64), layer.group_size, axis=1)


@pytest.mark.parametrize(("fmt", "group"), [("int8", None), ("int8", 32), ("int4", None),
                                            ("int4", 64)])
def test_quantized_layers_run_in_eager_and_compile_to_the_weight_only_gemm(fmt, group):
    model = _mlp()
    original = [m.weight.detach().numpy().copy() for m in model if hasattr(m, "weight")]
    assert tilefold.quantize(model, fmt, group_size=group) is model
    first, second, small = model[0], model[2], model[3]
    assert isinstance(first, WeightOnlyLinear) and isinstance(second, WeightOnlyLinear)
    assert type(small) is torch.nn.Linear  # 768 weights: below the pass's minimum
    assert first.group_size == (group or (64 if fmt == "int8" else 32))
    lo, hi = (-127, 127) if fmt == "int8" else (-8, 7)
    for layer, w in zip((first, second), original[:2], strict=True):
        codes = layer.codes.numpy()
        assert codes.min() >= lo and codes.max() <= hi and not hasattr(layer, "weight")
        step = np.repeat(layer.scale.numpy(), layer.group_size, axis=1)
        assert np.all(np.abs(_weights(layer) - w) <= step / 2 * (1 + 1e-6))
    x = torch.from_numpy(RNG.standard_normal((3, 64)).astype(np.float32))
    h = x.double().numpy() @ _weights(first).T + first.bias.double().numpy()
    h = h / (1 + np.exp(-h))
    h = h @ _weights(second).T
    want = h @ small.weight.double().detach().numpy().T + small.bias.double().detach().numpy()
    with torch.no_grad():
        eager = model(x).numpy()
        torch._dynamo.reset()
        report.REPORTS.clear()
        compiled = torch.compile(model, backend="tilefold", options={"strict": True})
        got = compiled(x).numpy()
    assert_close(eager, want, dtype="f32", reduced=128)
    assert_close(got, want, dtype="f32", reduced=128)
    configs = [d.winner.config for g in _graphs() for d in g.decisions()
               if d.winner.method == "blocks.gemm"]
    code = "i8" if fmt == "int8" else "i4"
    assert sum(c.get("weights") == code for c in configs) == 2


def test_a_quantized_llama_generates_eagers_tokens_on_the_same_codes():
    model = _model("llama")
    tilefold.quantize(model, "int4")
    layers = [m for m in model.modules() if isinstance(m, WeightOnlyLinear)]
    assert {m.format for m in layers} == {"int4", "int8"}  # the vocabulary head at int8
    assert model.lm_head.format == "int8"
    prompt = _prompt(2, 6)
    want = _generate(model, prompt, "static", 8)
    torch._dynamo.reset()
    report.REPORTS.clear()
    model.forward = torch.compile(model.forward, backend="tilefold", options={"strict": True})
    assert torch.equal(_generate(model, prompt, "static", 8), want)
    configs = [d.winner.config for g in _graphs() for d in g.decisions()
               if d.winner.method == "blocks.gemm"]
    assert {c.get("weights") for c in configs} >= {"i4", "i8"}


def test_bad_formats_and_groups_are_clear_errors():
    with pytest.raises(DTypeError, match="fmt='int3'"):
        tilefold.quantize(_mlp(), "int3")
    with pytest.raises(DTypeError, match="head='fp2'"):
        tilefold.quantize(_mlp(), "int8", head="fp2")
    with pytest.raises(ShapeError, match="group_size=0"):
        tilefold.quantize(_mlp(), "int4", group_size=0)


def test_torchao_int8_weight_only_layers_compile_to_the_weight_only_gemm_on_their_codes():
    """torchao's `Int8WeightOnlyConfig` weights are tensor subclasses: AOTAutograd hands their
    codes and scales to the backend as separate inputs, which the frontend freezes like the
    parameter they belong to, and `integer-weights` runs as x @ dequantize(codes, scales)."""
    torchao = pytest.importorskip("torchao.quantization")
    model = _mlp()
    torchao.quantize_(model, torchao.Int8WeightOnlyConfig())
    quantized = [m for m in model if hasattr(m, "weight")]
    assert all(type(m.weight).__name__ == "Int8Tensor" for m in quantized)
    dense = [m.weight.qdata.double().numpy() * m.weight.scale.double().numpy()
             for m in quantized]
    x = torch.from_numpy(RNG.standard_normal((3, 64)).astype(np.float32))
    h = x.double().numpy() @ dense[0].T + model[0].bias.double().detach().numpy()
    h = h / (1 + np.exp(-h))
    h = h @ dense[1].T
    want = h @ dense[2].T + model[3].bias.double().detach().numpy()
    with torch.no_grad():
        torch._dynamo.reset()
        report.REPORTS.clear()
        compiled = torch.compile(model, backend="tilefold", options={"strict": True})
        got = compiled(x).numpy()
    assert_close(got, want, dtype="f32", reduced=128)
    # the weight-only GEMM takes constant codes only: the weights were frozen; the last
    # layer's 768 codes are below the pass's minimum and run as an f32 constant
    (graph,) = _graphs()
    configs = [d.winner.config for d in graph.decisions() if d.winner.method == "blocks.gemm"]
    assert [c.get("weights") for c in configs] == ["i8", "i8", None]


def test_torchao_int4_group_wise_layers_compile_to_the_int4_kernels():
    """torchao's CPU int4 weight-only scheme (`IntxWeightOnlyConfig`, int4 codes in groups of
    32 along K, held as int8): its dequantization, spelled out in ATen ops, becomes one
    dequantize of int4 codes, run by the int4 weight-only GEMM."""
    torchao = pytest.importorskip("torchao.quantization")
    from torchao.quantization.granularity import PerGroup

    model = _mlp()
    torchao.quantize_(model, torchao.IntxWeightOnlyConfig(weight_dtype=torch.int4,
                                                          granularity=PerGroup(32)))
    dense = []
    for m in (model[0], model[2], model[3]):
        w = m.weight
        zero = np.repeat(w.zero_point.double().numpy(), 32, axis=1)
        dense.append((w.qdata.double().numpy() - zero) * np.repeat(w.scale.double().numpy(), 32,
                                                                    axis=1))
    x = torch.from_numpy(RNG.standard_normal((3, 64)).astype(np.float32))
    h = x.double().numpy() @ dense[0].T + model[0].bias.double().detach().numpy()
    h = h / (1 + np.exp(-h))
    want = h @ dense[1].T @ dense[2].T + model[3].bias.double().detach().numpy()
    with torch.no_grad():
        torch._dynamo.reset()
        report.REPORTS.clear()
        got = torch.compile(model, backend="tilefold", options={"strict": True})(x).numpy()
    assert_close(got, want, dtype="f32", reduced=128)
    (graph,) = _graphs()
    configs = [d.winner.config for d in graph.decisions() if d.winner.method == "blocks.gemm"]
    assert [c.get("weights") for c in configs] == ["i4", "i4", None]
