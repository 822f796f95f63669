"""Compiled fused attention: a kernel per `AttentionConfig`, called on NumPy arrays.

The native entry reads dims and strides itself, so one compiled kernel serves every shape;
the Python side only brings operands to rank 4 and to the layouts the kernel reads with
vectors (unit stride along v's, the mask's and the output's last dim), which costs nothing
for the layouts models produce (contiguous, or head-transposed views).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from collections.abc import Callable

import numpy as np

from tilefold.codegen.attention import flash
from tilefold.codegen.attention.flash import AttentionConfig
from tilefold.runtime import compile_generated, source_digest
from tilefold.runtime.replay import NativeCall
from tilefold.target import Target


class AttentionKernel:
    """`kernel(q, k, v, mask, out, scale)` fills `out` (mask None when the config has none)."""

    def __init__(self, cfg: AttentionConfig, fn: Callable[..., None], source: Callable[[], str]
                 ) -> None:
        self.cfg = cfg
        self.source = source  # () -> the LLVM IR, for explain
        self._fn = fn

    def __call__(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                 out: np.ndarray, scale: float) -> None:
        q, k, v, out4 = (_rank4(x) for x in (q, k, v, out))
        if v.strides[-1] != 4:
            v = np.ascontiguousarray(v)
        dst = out4 if out4.strides[-1] == 4 else np.empty(out4.shape, np.float32)
        if mask is None:
            self._fn(q, k, v, dst, scale)
        else:
            mask = _rank4(mask)
            if mask.shape[-1] != k.shape[-2] or mask.strides[-1] != mask.itemsize:
                mask = np.ascontiguousarray(np.broadcast_to(mask, (*mask.shape[:-1],
                                                                   k.shape[-2])))
            self._fn(q, k, v, mask, dst, scale)
        if dst is not out4:
            out4[...] = dst

    def calls(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
              out: np.ndarray, scale: float) -> list[NativeCall] | None:
        """The native call `self(...)` makes, for replay; None where it would copy first."""
        q, k, v, out4 = (_rank4(x) for x in (q, k, v, out))
        if v.strides[-1] != 4 or out4.strides[-1] != 4:
            return None
        if mask is None:
            return [NativeCall(self._fn, (q, k, v, out4, scale))]
        mask = _rank4(mask)
        if mask.shape[-1] != k.shape[-2] or mask.strides[-1] != mask.itemsize:
            return None
        return [NativeCall(self._fn, (q, k, v, mask, out4, scale))]


def _rank4(x: np.ndarray) -> np.ndarray:
    if x.ndim == 4:
        return x
    if x.ndim < 4:
        return x.reshape((1,) * (4 - x.ndim) + x.shape)
    return x.reshape((-1, *x.shape[-3:]))  # a copy only when the batch dims do not merge


# The code that shapes the kernel's IR (part of its cache key).
_GENERATORS = ("tilefold.codegen.attention", "tilefold.codegen.vecmath",
               "tilefold.codegen.llvm_util")


@functools.cache
def attention_kernel(cfg: AttentionConfig, target: Target) -> AttentionKernel:
    """The compiled kernel for `cfg` (cached in process and, by generator fingerprint, on disk)."""
    name = f"tf_attention_{hashlib.sha256(repr(cfg).encode()).hexdigest()[:12]}"

    def make_ir() -> str:
        return flash.attention_ir(cfg, name, target.triple, target.features)

    layout = (flash.DATA_OFFSET, flash.DIMS_OFFSET, flash.STRIDES_OFFSET)
    compiled = compile_generated(f"{source_digest(*_GENERATORS)}|{cfg!r}|{layout}", make_ir, target,
                                 name=name, uses_pool=cfg.threads > 1, opt_level=2)
    nobj = 5 if cfg.mask != "none" else 4
    fn = compiled.function(name, None, *([ctypes.py_object] * nobj), ctypes.c_float)
    return AttentionKernel(cfg, fn, make_ir)
