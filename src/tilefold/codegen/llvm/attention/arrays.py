"""Where a NumPy array object keeps its data, dims and strides, so native code reads them itself.

Generated entry points take the array objects (`PyObject *`) and load these fields, which makes
a call one ctypes dispatch with no per-call Python work to describe the operands. NumPy's
layout (`PyArrayObject_fields`: data, nd, dimensions, strides after the object header) is
checked on a live array at import, so a differently laid out build is detected, not assumed.
"""

from __future__ import annotations

import ctypes

import numpy as np


def _probe() -> tuple[int, int, int]:
    probe = np.empty((3, 5, 7), np.float32)[:, ::2]  # shape (3, 3, 7), strides (140, 56, 4)
    base = id(probe)
    ptr = ctypes.sizeof(ctypes.c_void_p)
    data = 2 * ptr  # after PyObject_HEAD
    dims, strides = data + 2 * ptr, data + 3 * ptr

    def array_at(offset: int) -> tuple[int, ...]:
        address = ctypes.c_void_p.from_address(base + offset).value
        return tuple((ctypes.c_int64 * 3).from_address(address))

    if (ctypes.c_void_p.from_address(base + data).value != probe.ctypes.data
            or ctypes.c_int.from_address(base + data + ptr).value != 3
            or array_at(dims) != probe.shape or array_at(strides) != probe.strides):
        raise ImportError("this NumPy lays out array objects differently; the fused attention "
                          "kernel cannot read them (the extern attention still runs)")
    return data, dims, strides


DATA_OFFSET, DIMS_OFFSET, STRIDES_OFFSET = _probe()
