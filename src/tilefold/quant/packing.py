"""Storage of 4-bit codes: two per byte along the quantization axis (even index in low nibble)."""

from __future__ import annotations

import numpy as np

from tilefold.dtypes import DType
from tilefold.errors import ShapeError


def pack_nibbles(codes: np.ndarray, axis: int) -> np.ndarray:
    """uint8 array with `axis` halved: byte i holds codes 2i (low nibble) and 2i+1 (high)."""
    if codes.shape[axis] % 2:
        raise ShapeError(
            f"quantize: 4-bit codes pack two per byte along axis {axis}, but it has odd length "
            f"{codes.shape[axis]} (shape {list(codes.shape)}); pad that axis to an even length"
        )
    bits = np.moveaxis(codes.view(np.uint8) & 0x0F, axis, -1)
    packed = bits[..., 0::2] | (bits[..., 1::2] << 4)
    return np.ascontiguousarray(np.moveaxis(packed, -1, axis))


def unpack_nibbles(packed: np.ndarray, axis: int, code: DType) -> np.ndarray:
    """Inverse of `pack_nibbles`: codes of dtype `code` (i4 or fp4e2m1), `axis` doubled."""
    p = np.moveaxis(packed, axis, -1)
    bits = np.stack([p & 0x0F, p >> 4], axis=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])
    if code.kind == "int":
        values = ((bits.astype(np.int8) ^ 8) - 8).astype(code.np_dtype)  # sign-extend 4 bits
    else:
        values = bits.astype(np.uint8).view(code.np_dtype)
    return np.ascontiguousarray(np.moveaxis(values, -1, axis))
