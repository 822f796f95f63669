"""`quantize`: choose blockwise scales (and zero points) for a float tensor and encode it."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from tilefold.errors import DTypeError, ShapeError
from tilefold.ir.ops.quant import CODE_RANGES, Quantize
from tilefold.quant.formats import Format, get_format
from tilefold.quant.tensor import QuantizedTensor


def _scale_shape(shape: tuple[int, ...], axis: int, group: int | None, per_tensor: bool):
    if per_tensor:
        return (1,) * len(shape)
    out = list(shape)
    out[axis] = 1 if group is None else shape[axis] // group
    return tuple(out)


def _check_group(fmt: Format, shape: tuple[int, ...], axis: int, group: int | None) -> None:
    k = shape[axis]
    if group is not None and (group < 1 or k % group):
        raise ShapeError(
            f"quantize({fmt.name}): group_size {group} does not divide the length {k} of axis "
            f"{axis} (shape {list(shape)}); use a divisor such as 32, 64 or 128, or pad the axis"
        )
    if fmt.bits == 4 and (k % 2 or (group is not None and group % 2)):
        raise ShapeError(
            f"quantize({fmt.name}): 4-bit codes pack two per byte along axis {axis}, so its "
            f"length ({k}, shape {list(shape)}) and group_size ({group}) must be even; pad it"
        )


def _block_reduce(x: np.ndarray, scale_shape: tuple[int, ...], fn) -> np.ndarray:
    """fn over each block of `x` (the blocks that scale_shape tiles it into)."""
    split = []
    for d, s in zip(x.shape, scale_shape, strict=True):
        split += [s, d // s]
    return fn(x.reshape(split), axis=tuple(range(1, 2 * x.ndim, 2)))


def quantize(w: ArrayLike, format: str | Format = "int4", *, group_size: int | None = None,
             axis: int = 0, symmetric: bool = True, per_tensor: bool = False) -> QuantizedTensor:
    """Quantize float `w` blockwise along `axis` (K of a [K, N] weight; 1 for torch's [N, K]).

    group_size None means the format's default (int4/fp4: 32; int8/fp8: one scale per channel,
    i.e. the whole axis); per_tensor=True uses one scale. Symmetric scales map the largest |w|
    of a block to the format's largest code; asymmetric (integer formats) map [min, max] onto
    the code range with a zero point. An all-zero block gets scale 1.
    """
    fmt = get_format(format)
    w = np.asarray(w)
    if not np.issubdtype(w.dtype, np.floating) and w.dtype.kind != "V":
        raise DTypeError(f"quantize({fmt.name}): expects a float tensor, got {w.dtype}")
    if w.ndim == 0:
        raise ShapeError(f"quantize({fmt.name}): needs a tensor of rank >= 1, got a scalar")
    if not symmetric and fmt.asymmetric_code is None:
        raise DTypeError(f"quantize({fmt.name}): the format is symmetric; drop symmetric=False")
    if not np.isfinite(w.astype(np.float64)).all():
        raise DTypeError(f"quantize({fmt.name}): w holds inf or NaN; clean the weights first")
    axis = axis % w.ndim
    group = fmt.default_group if group_size is None else group_size
    if group is not None and group >= w.shape[axis] and group_size is None:
        group = None
    _check_group(fmt, w.shape, axis, None if per_tensor else group)
    sshape = _scale_shape(w.shape, axis, group, per_tensor)
    x = w.astype(np.float64)
    zero_point = None
    if symmetric:
        amax = _block_reduce(np.abs(x), sshape, np.max)
        scale = np.where(amax > 0, amax / fmt.qmax, 1.0)
    else:
        code = fmt.asymmetric_code
        lo_code, hi_code = CODE_RANGES[code.name]
        lo = np.minimum(_block_reduce(x, sshape, np.min), 0.0)
        hi = np.maximum(_block_reduce(x, sshape, np.max), 0.0)
        scale = np.where(hi > lo, (hi - lo) / (hi_code - lo_code), 1.0)
        zero_point = np.clip(np.rint(lo_code - lo / scale), lo_code, hi_code).astype(
            code.np_dtype)
    scale = scale.astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)  # f32 underflow
    args = [x, scale] if zero_point is None else [x, scale, zero_point]
    code = fmt.code if zero_point is None else fmt.asymmetric_code
    codes = Quantize.reference(args, {"dtype": code})
    return QuantizedTensor.from_codes(fmt, codes, axis, scale, zero_point)
