"""Reading GGUF files (llama.cpp's format): Q8_0, Q4_0 and Q4_1 blocks as `QuantizedTensor`s.

The codes are kept as they are (4-bit ones repacked two a byte along K, tilefold's order);
each block's f16 scale (and Q4_1's f16 minimum) is widened to f32 once, exactly:

    Q8_0  34 bytes:  d, 32 int8 q          w = q * d       -> int8, group 32
    Q4_0  18 bytes:  d, 16 bytes of q       w = (q - 8) * d -> int4 (codes q - 8), group 32
    Q4_1  20 bytes:  d, m, 16 bytes of q    w = q * d + m   -> int4 (codes q - 8) with zero
                                                               point -8 and offset m, group 32

(byte j of a 4-bit block holds q[j] in its low nibble and q[j + 16] in its high one). A
weight of GGUF shape [ne0 = K, ne1 = N] is the [N, K] matrix of a torch Linear, quantized along
axis 1. F32 and F16 tensors come back as NumPy arrays; other types are refused, or dequantized
to f32 by the `gguf` package's own decoder with `others="f32"`. Needs the `gguf` package (the
`gguf` extra).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from tilefold.errors import UnsupportedError
from tilefold.quant.formats import get_format
from tilefold.quant.packing import pack_nibbles
from tilefold.quant.tensor import QuantizedTensor

BLOCK = 32


def _gguf():
    try:
        import gguf
    except ImportError as exc:
        raise UnsupportedError("reading GGUF files needs the `gguf` package: "
                               "pip install 'tilefold[gguf]'") from exc
    return gguf


@dataclass
class GGUFModel:
    """A GGUF file's tensors (by name, as the file names them) and metadata (by key)."""

    architecture: str
    metadata: dict[str, Any]
    tensors: dict[str, QuantizedTensor | np.ndarray]

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """The architecture's own keys without their prefix (block_count, embedding_length,
        attention.head_count, ...)."""
        prefix = f"{self.architecture}."
        return {k[len(prefix):]: v for k, v in self.metadata.items() if k.startswith(prefix)}


def _blocks(raw: np.ndarray, k: int, size: int) -> np.ndarray:
    """The rows of a block-quantized tensor as [rows, K / 32, block bytes]."""
    return np.ascontiguousarray(raw).reshape(-1, k // BLOCK, size)


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of each block, widened to f32 (exact)."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0] \
        .astype(np.float32)


def _nibbles(blocks: np.ndarray, at: int) -> np.ndarray:
    """The 32 4-bit q of each block (16 bytes from `at`) as uint8 [rows, K]."""
    qs = blocks[..., at:at + 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return q.reshape(q.shape[0], -1)


def q8_0(raw: np.ndarray, shape: tuple[int, int]) -> QuantizedTensor:
    """A Q8_0 tensor's bytes (rows of blocks) as int8 codes with group-32 scales."""
    n, k = shape
    blocks = _blocks(raw, k, 34)
    codes = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(n, k)
    return QuantizedTensor.from_codes("int8", codes, 1, _half(blocks, 0))


def _int4(q: np.ndarray) -> np.ndarray:
    """Unsigned 4-bit q as the int4 codes q - 8, packed two a byte along K."""
    return pack_nibbles((q ^ 8).view(np.uint8), 1)


def q4_0(raw: np.ndarray, shape: tuple[int, int]) -> QuantizedTensor:
    """A Q4_0 tensor: int4 codes q - 8 with the blocks' scales (of either sign, or 0)."""
    n, k = shape
    blocks = _blocks(raw, k, 18)
    return QuantizedTensor(get_format("int4"), (n, k), 1, _int4(_nibbles(blocks, 2)),
                           _half(blocks, 0))


def q4_1(raw: np.ndarray, shape: tuple[int, int]) -> QuantizedTensor:
    """A Q4_1 tensor: int4 codes q - 8, zero point -8 and offset m, so (c + 8) * d + m."""
    n, k = shape
    blocks = _blocks(raw, k, 20)
    scale = _half(blocks, 0)
    zero = np.full(scale.shape, -8, ml_dtypes.int4)
    return QuantizedTensor(get_format("int4"), (n, k), 1, _int4(_nibbles(blocks, 4)), scale,
                           zero, _half(blocks, 2))


_READERS = {"Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1}


def _value(field) -> Any:
    try:
        return field.contents()
    except (ValueError, IndexError, TypeError):  # a field type the reader cannot decode
        return None


def load_gguf(path: str | os.PathLike, *, others: str = "refuse") -> GGUFModel:
    """The tensors and metadata of the GGUF file at `path`. Q8_0, Q4_0 and Q4_1 tensors become
    `QuantizedTensor`s, F32 and F16 ones arrays of their dtype; any other type raises
    UnsupportedError, or with others="f32" is dequantized to f32 by the `gguf` package."""
    gguf = _gguf()
    if others not in ("refuse", "f32"):
        raise UnsupportedError(f"load_gguf: others={others!r}; use 'refuse' or 'f32'")
    reader = gguf.GGUFReader(os.fspath(path))
    metadata = {name: _value(field) for name, field in reader.fields.items()}
    tensors: dict[str, QuantizedTensor | np.ndarray] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        shape = tuple(int(d) for d in reversed(t.shape))  # NumPy order: [..., ne1, ne0]
        if kind in ("F32", "F16"):
            tensors[t.name] = np.array(t.data).reshape(shape)
        elif kind in _READERS and len(shape) == 2 and shape[1] % BLOCK == 0:
            tensors[t.name] = _READERS[kind](t.data, shape)
        elif others == "f32":
            tensors[t.name] = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type) \
                .reshape(shape).astype(np.float32)
        else:
            raise UnsupportedError(
                f"load_gguf: tensor {t.name!r} {list(shape)} is {kind}; tilefold keeps Q8_0, "
                "Q4_0, Q4_1 (and F32/F16) as they are: pass others='f32' to dequantize the "
                "rest")
    arch = metadata.get("general.architecture") or ""
    return GGUFModel(str(arch), metadata, tensors)
