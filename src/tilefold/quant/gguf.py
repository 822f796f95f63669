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
to f32 by the `gguf` package's own decoder with `others="f32"` (only those need the `gguf`
package, the `gguf` extra).

The file's header is parsed here (`GGUFFile`, the tensors memory-mapped): the `gguf`
package's reader spends seconds on a tokenizer's hundred thousand metadata strings.
`GGUFFile[name]` is a tensor in f32, computed as the `gguf` package computes it (f32 d * q,
plus m), so a model built from it holds the numbers transformers loads from the same file.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import UnsupportedError
from tilefold.quant.formats import get_format
from tilefold.quant.packing import pack_nibbles
from tilefold.quant.tensor import QuantizedTensor
from tilefold.runtime.numpy_threads import by_rows

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
    zero = np.full(scale.shape, -8, dtypes.i4.np_dtype)
    return QuantizedTensor(get_format("int4"), (n, k), 1, _int4(_nibbles(blocks, 4)), scale,
                           zero, _half(blocks, 2))


_READERS = {"Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1}


# GGUF metadata value types: NumPy scalar types by id (8 string, 9 array).
_SCALARS = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
            6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9
# Their little-endian `struct` codes, standard sizes.
_STRUCT = {np.dtype(t): "<" + c for t, c in zip(
    _SCALARS.values(), ("B", "b", "H", "h", "I", "i", "f", "?", "Q", "q", "d"), strict=True)}
# Tensor types read here (ggml's ids): bytes per block of `elements`.
_TYPES = {0: ("F32", 4, 1), 1: ("F16", 2, 1), 2: ("Q4_0", 18, BLOCK), 3: ("Q4_1", 20, BLOCK),
          8: ("Q8_0", 34, BLOCK)}
GGUF_MAGIC = b"GGUF"


class _Cursor:
    """Little-endian reads through a byte buffer (a memoryview: a tokenizer's hundred thousand
    strings are read in tens of milliseconds)."""

    def __init__(self, data: np.ndarray):
        self.data, self.at = memoryview(data), 0

    def _need(self, size: int) -> None:
        if self.at + size > len(self.data):
            raise UnsupportedError("GGUF file is truncated (its header runs past the end)")

    def take(self, dtype: Any, count: int = 1) -> np.ndarray:
        dtype = np.dtype(dtype).newbyteorder("<")
        size = dtype.itemsize * count
        self._need(size)
        out = np.frombuffer(self.data, dtype, count, self.at)
        self.at += size
        return out

    def scalar(self, dtype: Any) -> Any:
        code = _STRUCT[np.dtype(dtype)]
        size = struct.calcsize(code)
        self._need(size)
        (value,) = struct.unpack_from(code, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        n = self.scalar(np.uint64)
        self._need(n)
        text = bytes(self.data[self.at:self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return text

    def strings(self, count: int) -> Strings:
        """`count` strings, decoded when read (a tokenizer's vocabulary is not needed to build
        a model): here only their lengths are walked."""
        spans, at, end = [], self.at, len(self.data)
        length = struct.Struct("<Q").unpack_from
        for _ in range(count):  # the hot loop of a header: no method calls in it
            if at + 8 > end:
                break
            start = at + 8
            at = start + length(self.data, at)[0]
            if at > end:
                break
            spans += (start, at)
        else:
            self.at = at
            return Strings(self.data, spans)
        raise UnsupportedError("GGUF file is truncated (its header runs past the end)")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar(np.uint32), self.scalar(np.uint64)
            if item in _SCALARS:
                return self.take(_SCALARS[item], count).tolist()
            if item == _STRING:
                return self.strings(count)
            return [self.value(item) for _ in range(count)]
        if kind not in _SCALARS:
            raise UnsupportedError(f"GGUF metadata value of unknown type {kind}")
        return self.scalar(_SCALARS[kind])


class Strings(Sequence[str]):
    """A metadata array of strings, each decoded (UTF-8) when read."""

    def __init__(self, data: memoryview, spans: list[int]):
        self._data, self._spans = data, spans  # start, end of each string, in turn

    def __len__(self) -> int:
        return len(self._spans) // 2

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"string {i} of {len(self)}")
        j = 2 * (i % len(self))
        text = bytes(self._data[self._spans[j]:self._spans[j + 1]])
        return text.decode("utf-8", errors="replace")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Strings({len(self)})"


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: its name, ggml type (name and id), NumPy shape ([..., ne1,
    ne0]) and raw bytes (a view of the memory-mapped file)."""

    name: str
    kind: str
    type_id: int
    shape: tuple[int, ...]
    data: np.ndarray


def _dequantize_other(t: GGUFTensor) -> np.ndarray:
    """A tensor of a type tilefold does not read, decoded by the `gguf` package."""
    gguf = _gguf()
    kind = gguf.GGMLQuantizationType(t.type_id)
    return gguf.quants.dequantize(t.data, kind).reshape(t.shape).astype(np.float32, copy=False)


def _f32(t: GGUFTensor) -> np.ndarray:
    """`t` as f32, computed as the `gguf` package computes it (float32 d * q (+ m)): the numbers
    transformers loads."""
    if t.kind == "F32":  # the file's own bytes (read-only), no copy
        return t.data.view(np.float32).reshape(t.shape)
    if t.kind == "F16":
        return t.data.view(np.float16).reshape(t.shape).astype(np.float32)
    if t.kind not in ("Q8_0", "Q4_0", "Q4_1"):
        return _dequantize_other(t)
    n, k = t.shape
    blocks = _blocks(t.data, k, _TYPES[t.type_id][1])
    out = np.empty((n, k), np.float32)

    def decode(lo: int, hi: int) -> None:  # rows lo..hi, as the `gguf` package decodes them
        part = blocks[lo:hi]
        d = _half(part, 0)[..., None]
        if t.kind == "Q8_0":
            w = d * part[..., 2:].view(np.int8).astype(np.float32)
        else:
            q = _nibbles(part, 2 if t.kind == "Q4_0" else 4) \
                .reshape((*part.shape[:2], BLOCK)).astype(np.float32)
            w = d * (q - np.float32(8)) if t.kind == "Q4_0" else d * q + _half(part, 2)[..., None]
        out[lo:hi] = w.reshape(hi - lo, k)

    by_rows(n, decode, row_elements=k)
    return out


class GGUFFile:
    """A GGUF file opened for reading (memory-mapped, its header parsed here): its metadata,
    tensors (`tensors[name]`: raw blocks) and each tensor as f32 when asked for (`file[name]`,
    computed as transformers computes it; an F32 tensor is a read-only view of the file), so a
    model can be built a tensor at a time without ever holding all of it in f32. `data` is the
    whole file, memory-mapped."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            raw = np.memmap(self.path, np.uint8, mode="r").view(np.ndarray)
        except (OSError, ValueError) as exc:
            raise UnsupportedError(f"cannot read GGUF file {self.path!r}: {exc}") from None
        self.data = raw
        cur = _Cursor(raw)
        if len(raw) < 24 or bytes(raw[:4]) != GGUF_MAGIC:
            raise UnsupportedError(f"{self.path!r} is not a GGUF file (no GGUF magic)")
        cur.at = 4
        version = cur.scalar(np.uint32)
        if version not in (2, 3):
            raise UnsupportedError(f"{self.path!r}: GGUF version {version}; tilefold reads 2, 3")
        count, fields = cur.scalar(np.uint64), cur.scalar(np.uint64)
        self.metadata: dict[str, Any] = {}
        for _ in range(fields):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar(np.uint32))
        self.architecture = str(self.metadata.get("general.architecture") or "")
        infos = []
        for _ in range(count):
            name = cur.string()
            dims = cur.take(np.uint64, cur.scalar(np.uint32)).tolist()
            infos.append((name, tuple(int(d) for d in reversed(dims)), cur.scalar(np.uint32),
                          cur.scalar(np.uint64)))
        align = int(self.metadata.get("general.alignment", 32))
        base = -(-cur.at // align) * align
        self.tensors: dict[str, GGUFTensor] = {}
        for name, shape, type_id, offset in infos:
            nbytes = _nbytes(name, type_id, shape)
            if base + offset + nbytes > len(raw):
                raise UnsupportedError(f"GGUF file {self.path!r} is truncated: tensor {name!r} "
                                       "runs past its end")
            kind = _TYPES[type_id][0] if type_id in _TYPES else \
                _gguf().GGMLQuantizationType(type_id).name
            self.tensors[name] = GGUFTensor(name, kind, type_id, shape,
                                            raw[base + offset:base + offset + nbytes])

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> np.ndarray:
        return _f32(self.tensors[name])


def _nbytes(name: str, type_id: int, shape: tuple[int, ...]) -> int:
    """A tensor's bytes in the file."""
    elements = int(np.prod(shape, dtype=np.int64))
    if type_id in _TYPES:
        _, size, block = _TYPES[type_id]
    else:
        sizes = getattr(_gguf(), "GGML_QUANT_SIZES", {})
        kind = next((k for k in sizes if int(k) == type_id), None)
        if kind is None:
            raise UnsupportedError(f"GGUF tensor {name!r} has unknown type {type_id}")
        block, size = sizes[kind]
    if elements % block:
        raise UnsupportedError(f"GGUF tensor {name!r} {list(shape)}: {elements} elements are "
                               f"not whole blocks of {block}")
    return elements // block * size


def load_gguf(path: str | os.PathLike, *, others: str = "refuse") -> GGUFModel:
    """The tensors and metadata of the GGUF file at `path`. Q8_0, Q4_0 and Q4_1 tensors become
    `QuantizedTensor`s, F32 and F16 ones arrays of their dtype; any other type raises
    UnsupportedError, or with others="f32" is dequantized to f32 by the `gguf` package."""
    if others not in ("refuse", "f32"):
        raise UnsupportedError(f"load_gguf: others={others!r}; use 'refuse' or 'f32'")
    file = GGUFFile(path)
    tensors: dict[str, QuantizedTensor | np.ndarray] = {}
    for t in file.tensors.values():
        kind, shape = t.kind, t.shape
        if kind in ("F32", "F16"):
            tensors[t.name] = t.data.view(np.float32 if kind == "F32" else np.float16) \
                .reshape(shape).copy()
        elif kind in _READERS and len(shape) == 2 and shape[1] % BLOCK == 0:
            tensors[t.name] = _READERS[kind](t.data, shape)
        elif others == "f32":
            tensors[t.name] = _dequantize_other(t)
        else:
            raise UnsupportedError(
                f"load_gguf: tensor {t.name!r} {list(shape)} is {kind}; tilefold keeps Q8_0, "
                "Q4_0, Q4_1 (and F32/F16) as they are: pass others='f32' to dequantize the "
                "rest")
    return GGUFModel(file.architecture, file.metadata, tensors)
