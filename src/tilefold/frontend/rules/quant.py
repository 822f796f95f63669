"""Lowering rule for weight-only layers (`tilefold.quantize(model)`): `tilefold::dequantize`.

The codes are a frozen buffer (an IR constant of int8); int4 codes are re-typed as the IR's i4,
so the weight-only GEMM reads them as int4. Fusion makes the dequantize the matmul's prologue.
"""

from __future__ import annotations

from typing import Any

import torch

from tilefold import dtypes
from tilefold.frontend import quantize  # noqa: F401  (defines tilefold::dequantize)
from tilefold.frontend.context import LoweringContext
from tilefold.frontend.lowering import NotApplicable, lowering


@lowering(torch.ops.tilefold.dequantize.default)
def dequantize(ctx: LoweringContext, codes: Any, scale: Any, bits: int) -> Any:
    """codes times scales per block: the IR's dequantize (int4 codes as i4 constants)"""
    c = ctx.tensor(codes)
    if bits == 4:
        const = c.value.defining_op
        if const is None or const.name != "constant":
            raise NotApplicable("int4 codes known only at run time (weight-only layers' codes "
                                "are frozen buffers)")
        c = ctx.b.constant(const.attrs["value"].astype(dtypes.i4.np_dtype))
    return ctx.op("dequantize", c, ctx.cast(ctx.tensor(scale), dtypes.f32), dtype=dtypes.f32)
