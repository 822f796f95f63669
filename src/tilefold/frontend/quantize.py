"""`tilefold.quantize(model, ...)`: a PyTorch model's linear layers with weight-only int8/int4.

Each `nn.Linear` the quantize-weights pass would take (enough elements, K a whole number of
groups) becomes a `WeightOnlyLinear` holding codes (int8; int4 codes are int8 in -8..7) and
f32 scales per output channel and group of K, chosen as the pass chooses them
(`quantize_weight`); the vocabulary head takes `head` (int8 by default, as the pass). Its
forward multiplies by `tilefold::dequantize(codes, scale, bits)`, a PyTorch custom op: in
eager it dequantizes and the layer runs anywhere; tilefold lowers it to the IR's `dequantize`
of the frozen codes (`rules/quant.py`), which fusion makes the matmul's prologue and the
weight-only GEMV decodes in registers. The f32 weight is dropped: the model keeps the codes.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tilefold.errors import DTypeError, ShapeError
from tilefold.passes.quantize_weights import FORMATS, QuantizeWeights, quantize_weight

BITS = {"int8": 8, "int4": 4}
_MIN_ELEMENTS = next(o.default for o in QuantizeWeights.options if o.name == "min-elements")


@torch.library.custom_op("tilefold::dequantize", mutates_args=())
def dequantize(codes: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """codes[N, K] (int8) times scale[N, K / group], repeated along K: the f32 weight."""
    group = codes.shape[1] // scale.shape[1]
    return codes.to(scale.dtype) * scale.repeat_interleave(group, dim=1)


@dequantize.register_fake
def _(codes: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    return codes.new_empty(codes.shape, dtype=scale.dtype)


class WeightOnlyLinear(torch.nn.Module):
    """y = x @ dequantize(codes, scale).T + bias: a linear layer with quantized weights."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 fmt: str):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.format, self.bits = fmt, BITS[fmt]
        self.group_size = codes.shape[1] // scale.shape[1]
        # Parameters (not buffers): tilefold freezes a model's parameters as constants, and
        # the weight-only GEMM takes constant codes.
        self.codes = torch.nn.Parameter(codes, requires_grad=False)
        self.scale = torch.nn.Parameter(scale, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, torch.ops.tilefold.dequantize(self.codes, self.scale, self.bits),
                        self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.format}, group_size={self.group_size}")


def quantize_model(model: torch.nn.Module, fmt: str = "int8", group_size: int | None = None,
                   head: str | None = "int8", min_elements: int = _MIN_ELEMENTS
                   ) -> torch.nn.Module:
    """Replace `model`'s linear layers by `WeightOnlyLinear`s at `fmt` ("int8" or "int4") with
    a scale per `group_size` along K (None: int8 one per output channel, int4 32), in place;
    returns the model. `head` is the output projection's format (None: `fmt`). Layers with
    fewer than `min_elements` weights or K not a multiple of the group stay as they are."""
    for name, value in (("fmt", fmt), ("head", head or fmt)):
        if value not in FORMATS:
            raise DTypeError(f"tilefold.quantize: {name}={value!r}; use one of "
                             f"{', '.join(FORMATS)}")
    if group_size is not None and group_size <= 0:
        raise ShapeError(f"tilefold.quantize: group_size={group_size}; use a positive size "
                         "(32, 64, 128) or None for the format's")
    get_head = getattr(model, "get_output_embeddings", None)
    head_module = get_head() if callable(get_head) else None
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            layer_fmt = (head or fmt) if child is head_module else fmt
            group = group_size or FORMATS[layer_fmt][3]
            w = child.weight.detach()
            if w.numel() < min_elements or w.dtype != torch.float32 or \
                    (group and w.shape[1] % group) or (BITS[layer_fmt] == 4 and w.shape[1] % 2):
                continue
            codes, scale = quantize_weight(w.numpy(), 1, layer_fmt, group_size)
            bias = None if child.bias is None else child.bias.detach()
            setattr(parent, child_name, WeightOnlyLinear(
                torch.from_numpy(codes.astype(np.int8)), torch.from_numpy(scale), bias,
                layer_fmt))
    return model
