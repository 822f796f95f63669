"""Random numbers as a pure function of a seed: `random_uniform`, counter-based.

Element i of `random_uniform(%seed) {shape, stream}` is a hash of (seed, stream, i), so the op
is deterministic given its operand (the reference interpreter and every compiled kernel agree
bit for bit, and a backward pass that recomputes it gets the same draw) while a new seed each
call (the frontend draws one from PyTorch's generator) gives new numbers. `stream` separates
the draws of one graph that share its seed (each dropout site has its own).

The hash: two 32-bit keys are made from the seed and the stream; element i (a 64-bit counter,
low word `lo`, high word `hi`) is

    x = mix(lo ^ k0);  x = mix(x + (k1 ^ hi * GOLDEN))          (all mod 2**32)

with `mix` Chris Wellons' "lowbias32" integer finalizer (a bijection: shifts, xors and two
multiplies, cheap in SIMD lanes). The float is the top 24 bits scaled by 2**-24: uniform on
[0, 1), every value exact in f32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import DTypeError, ShapeError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.types import TensorType

GOLDEN = 0x9E3779B9  # 2**32 / the golden ratio: spreads consecutive streams and high words
MIX = (16, 0x7FEB352D, 15, 0x846CA68B, 16)  # lowbias32: shift, multiply, shift, multiply, shift
MASK = 0xFFFFFFFF


def mix(x: Any) -> Any:
    """lowbias32 on uint32 NumPy values (or a Python int, masked to 32 bits)."""
    s0, m0, s1, m1, s2 = MIX
    if isinstance(x, int):
        x &= MASK
        x ^= x >> s0
        x = (x * m0) & MASK
        x ^= x >> s1
        x = (x * m1) & MASK
        return x ^ (x >> s2)
    x = x ^ (x >> np.uint32(s0))
    x = x * np.uint32(m0)
    x = x ^ (x >> np.uint32(s1))
    x = x * np.uint32(m1)
    return x ^ (x >> np.uint32(s2))


def keys(seed: int, stream: int) -> tuple[int, int]:
    """The two 32-bit keys of a (64-bit seed, stream) pair."""
    seed &= (1 << 64) - 1
    k0 = mix((seed & MASK) ^ mix(stream * GOLDEN + 1))
    return k0, mix((seed >> 32) + k0)


def uniform(seed: int, stream: int, n: int) -> np.ndarray:
    """The first `n` numbers of the (seed, stream) draw, as f32 in [0, 1)."""
    k0, k1 = keys(seed, stream)
    i = np.arange(n, dtype=np.uint64)
    lo, hi = (i & np.uint64(MASK)).astype(np.uint32), (i >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        x = mix(lo ^ np.uint32(k0))
        x = mix(x + (np.uint32(k1) ^ (hi * np.uint32(GOLDEN))))
    return ((x >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)).astype(np.float32)


@register
class RandomUniform(OpDef):
    """Uniform f32 numbers in [0, 1) of `shape`, drawn from the 0-d i64 `seed` by the counter
    hash above (row-major element order); `stream` tells apart draws sharing a seed.

    `%u = random_uniform(%seed) {shape = [8, ?s], stream = 2} : f32[8,?s]`
    """

    name = "random_uniform"
    operands = ("seed",)
    attributes = attr_table(
        shape=Attr("shape"),
        stream=Attr("int", 0, doc="which of the seed's draws (one per random site)"),
    )

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (seed,) = types
        if seed.dtype != dtypes.i64 or seed.rank != 0:
            raise DTypeError(f"random_uniform: the seed must be an i64 scalar, got {seed}")
        shape = tuple(attrs["shape"])
        if any(isinstance(d, int) and d < 0 for d in shape):
            raise ShapeError(f"random_uniform: negative size in {list(shape)}")
        return [TensorType(shape, dtypes.f32)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        shape = tuple(int(d) for d in attrs["shape"])
        seed = int(np.asarray(args[0]).astype(np.int64))
        return uniform(seed, attrs["stream"], int(np.prod(shape))).reshape(shape)
