"""Lowering rules for convolutions whose windows do not overlap: patches, then one GEMM.

A 2-D convolution with stride equal to its kernel, no padding, no dilation and one group (a
vision transformer's patch embedding, or a 1x1 convolution) reads every input element once:
cutting the image into kernel-sized patches is a reshape and a transpose, and the convolution
is then `patches @ weight^T + bias`, which fuses like any GEMM with a bias. Other
convolutions are left to PyTorch.
"""

from __future__ import annotations

from typing import Any

import torch

from tilefold.frontend.context import LoweringContext
from tilefold.frontend.lowering import NotApplicable, lowering

aten = torch.ops.aten


@lowering(aten.convolution.default)
def convolution(ctx: LoweringContext, x: Any, weight: Any, bias: Any, stride: list[int],
                padding: list[int], dilation: list[int], transposed: bool,
                output_padding: list[int], groups: int) -> Any:
    """2-D convolution with non-overlapping windows, as patches @ weight^T (+ bias)"""
    t, w = ctx.tensor(x), ctx.tensor(weight)
    if t.ndim != 4 or w.ndim != 4:
        raise NotApplicable(f"{t.ndim - 2}-D convolution (only 2-D is lowered)")
    out_ch, in_ch, p, q = w.shape
    if transposed or groups != 1 or any(padding) or any(d != 1 for d in dilation):
        raise NotApplicable("convolution with padding, dilation, groups or transposed")
    if list(stride) != [p, q]:
        raise NotApplicable(f"convolution with stride {list(stride)} != kernel {[p, q]}")
    batch, channels, height, width = t.shape
    if not all(isinstance(d, int) for d in (channels, height, width)):
        raise NotApplicable("convolution over symbolic channel or image sizes")
    if height % p or width % q:
        raise NotApplicable(f"image {height}x{width} is not a whole number of {p}x{q} patches")
    rows, cols = height // p, width // q
    patches = ctx.op("reshape", t, shape=[batch, channels, rows, p, cols, q])
    patches = ctx.op("transpose", patches, perm=[0, 2, 4, 1, 3, 5])
    patches = ctx.op("reshape", patches, shape=[batch, rows, cols, in_ch * p * q])
    kernel = ctx.op("reshape", w, shape=[out_ch, in_ch * p * q])
    out = ctx.op("matmul", patches, ctx.cast(kernel, t.dtype), transpose_b=True)
    if bias is not None:
        out = ctx.op("add", out, ctx.cast(ctx.tensor(bias), t.dtype))
    return ctx.op("transpose", out, perm=[0, 3, 1, 2])
