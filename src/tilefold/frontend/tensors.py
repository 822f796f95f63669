"""PyTorch ⇄ tilefold values: dtype table and zero-copy-where-possible tensor/array conversion."""

from __future__ import annotations

import weakref

import numpy as np
import torch

from tilefold import dtypes
from tilefold.dtypes import DType
from tilefold.errors import DTypeError

DTYPES: dict[torch.dtype, DType] = {
    torch.float64: dtypes.f64,
    torch.float32: dtypes.f32,
    torch.float16: dtypes.f16,
    torch.bfloat16: dtypes.bf16,
    torch.int64: dtypes.i64,
    torch.int32: dtypes.i32,
    torch.int8: dtypes.i8,
    torch.uint8: dtypes.u8,
    torch.bool: dtypes.boolean,
}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}


def to_dtype(dt: torch.dtype) -> DType:
    found = DTYPES.get(dt)
    if found is None:
        raise DTypeError(f"PyTorch dtype {dt} has no tilefold equivalent")
    return found


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor's data as a NumPy array (shares memory for CPU tensors; bf16 via a bit view)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtypes.bf16.np_dtype)
    return t.numpy()


# A frozen weight's array by the tensor, its version and memory, held weakly (the array keeps
# the weight's storage alive, so that memory cannot be another tensor's meanwhile).
_FROZEN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def frozen_array(t: torch.Tensor) -> np.ndarray:
    """`to_numpy(t)` for a weight frozen into graphs: the same array object for every graph
    made while the weight is unchanged (its version), so what passes and kernels derive from
    it once (packed copies, keyed by the array) serves all of a model's graphs."""
    key = (id(t), t._version, t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.dtype))
    found = _FROZEN.get(key)
    if found is None:
        found = _FROZEN[key] = to_numpy(t)
    return found


def to_torch(a: np.ndarray) -> torch.Tensor:
    """The array as a CPU tensor of the same shape (0-d stays 0-d; shares contiguous memory)."""
    a = np.asarray(a, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
    if a.dtype == dtypes.bf16.np_dtype:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
