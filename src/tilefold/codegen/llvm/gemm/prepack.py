"""Pre-packed constant B operands (weights): packed once into the micro-kernel's panel layout."""

from __future__ import annotations

import numpy as np

from tilefold.codegen.llvm.gemm.module import GemmModule


class PackedMatrix:
    """B[K, N] packed into NR-column, full-K panels for one GEMM module; use as matmul's `b`.

    Packing is the GEMM's own B packing run once with KC = K and NC = N. It holds a copy:
    later writes to the source array are not seen."""

    def __init__(self, b: np.ndarray | None, module: GemmModule,
                 shape: tuple[int, int] | None = None):
        k, n = b.shape if b is not None else shape
        kern = module.kernel
        self.module = module
        self.shape = (k, n)
        self.dtype = b.dtype if b is not None else np.dtype(np.float32)
        self.ndim = 2
        full, rest = divmod(n, kern.nr)
        padded = full * kern.nr + -(-rest // kern.lanes) * kern.lanes
        self.data = np.empty(max(1, padded * k), np.float32)
        if b is not None and k and n:
            el = b.itemsize
            module.pack_b(k, n, b.ctypes.data, b.strides[0] // el, b.strides[1] // el,
                          self.data.ctypes.data)

    @classmethod
    def unfilled(cls, shape: tuple[int, int], module: GemmModule) -> PackedMatrix:
        """Room for a [K, N] B in `module`'s panels, for a kernel that writes them itself (the
        weight-only decoder, `codegen/llvm/lowp/wunpack.py`): full NR-column panels of K rows, then
        the last panel as wide as the rest of N rounded up to whole vectors."""
        return cls(None, module, shape)

    def __repr__(self) -> str:
        return f"PackedMatrix(shape={self.shape}, kernel={self.module.kernel.name})"
