"""Compiled fused attention: a kernel per config (`AttentionConfig`: flash, for many query rows;
`DecodeConfig`: a few rows against a long cache), called on NumPy arrays.

Both share one entry (`entry.py`) that reads dims and strides itself, so one compiled kernel
serves every shape; the Python side only brings operands to rank 4 and to the layouts the
kernel reads with vectors (unit stride along v's, the mask's and the output's last dim, and
k's for the decode kernel), which costs nothing for the layouts models produce (contiguous,
head-transposed views, a cache's slices).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from collections.abc import Callable

import numpy as np

from tilefold.codegen.llvm.attention import backward, decode, flash
from tilefold.codegen.llvm.attention.backward import BackwardConfig
from tilefold.codegen.llvm.attention.decode import DecodeConfig
from tilefold.codegen.llvm.attention.flash import AttentionConfig
from tilefold.runtime import compile_generated, source_digest
from tilefold.runtime.arrays import DATA_OFFSET, DIMS_OFFSET, STRIDES_OFFSET
from tilefold.runtime.replay import NativeCall
from tilefold.target import Target


class AttentionKernel:
    """`kernel(q, k, v, mask, out, scale[, lse])` fills `out` (mask None when the config has
    none) and, with `AttentionConfig.lse`, each query row's log-sum-exp in `lse`."""

    def __init__(self, cfg: AttentionConfig | DecodeConfig, fn: Callable[..., None],
                 source: Callable[[], str]) -> None:
        self.cfg = cfg
        self.source = source  # () -> the LLVM IR, for explain
        self._fn = fn

    def __call__(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                 out: np.ndarray, scale: float, lse: np.ndarray | None = None) -> None:
        operands, _ = self._operands(q, k, v, mask, out, lse)
        self._fn(*operands, scale)
        written = operands[-2] if lse is not None else operands[-1]
        if not np.may_share_memory(written, out):  # written to a copy
            _rank4(out)[...] = written

    def calls(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
              out: np.ndarray, scale: float, lse: np.ndarray | None = None
              ) -> list[NativeCall] | None:
        """The native call `self(...)` makes, for replay; None where it would copy first."""
        operands, copied = self._operands(q, k, v, mask, out, lse)
        return None if copied else [NativeCall(self._fn, (*operands, scale))]

    def _operands(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                  out: np.ndarray, lse: np.ndarray | None = None
                  ) -> tuple[tuple[np.ndarray, ...], bool]:
        """The entry's array operands (q, k, v, [mask,] out[, lse]) at rank 4 in layouts it
        reads with vectors, and whether any of them had to be a copy."""
        if lse is not None:  # strided as it comes: written one row at a time
            operands, copied = self._operands(q, k, v, mask, out)
            return (*operands, _rank4(lse[..., None])), copied
        q, k, v, out = (_rank4(x) for x in (q, k, v, out))
        copied = False
        if v.strides[-1] != 4:
            v, copied = np.ascontiguousarray(v), True
        if isinstance(self.cfg, DecodeConfig) and k.shape[-1] > 1 and k.strides[-1] != 4:
            k, copied = np.ascontiguousarray(k), True
        if out.strides[-1] != 4:
            out, copied = np.empty(out.shape, np.float32), True
        if mask is None:
            return (q, k, v, out), copied
        mask = _rank4(mask)
        if mask.shape[-1] != k.shape[-2] or mask.strides[-1] != mask.itemsize:
            mask = np.ascontiguousarray(np.broadcast_to(mask, (*mask.shape[:-1], k.shape[-2])))
            copied = True
        return (q, k, v, mask, out), copied


class BackwardKernel:
    """`kernel(dout, q, k, v, lse, delta, bias, dq, dk, dv, scale)` fills dq, dk and dv (bias
    None when the config has none)."""

    def __init__(self, cfg: BackwardConfig, fn: Callable[..., None],
                 source: Callable[[], str]) -> None:
        self.cfg = cfg
        self.source = source
        self._fn = fn

    def __call__(self, *arrays: np.ndarray | float | None) -> None:
        *arrays, scale = arrays
        operands, outs, _ = self._operands(*arrays)
        self._fn(*operands, scale)
        for given, used in zip(arrays[-3:], outs, strict=True):
            if not np.may_share_memory(given, used):  # written to a copy
                _rank4(given)[...] = used

    def calls(self, *arrays: np.ndarray | float | None) -> list[NativeCall] | None:
        """The native call `self(...)` makes, for replay; None where it would copy first."""
        *arrays, scale = arrays
        operands, _, copied = self._operands(*arrays)
        return None if copied else [NativeCall(self._fn, (*operands, scale))]

    def _operands(self, dout, q, k, v, lse, delta, bias, dq, dk, dv):
        """The entry's operands at rank 4 (lse and delta with a trailing 1), every row
        contiguous; the outputs among them; whether any is a copy."""
        copied = False

        def rows(x: np.ndarray, out: bool = False) -> np.ndarray:
            nonlocal copied
            x = _rank4(x)
            if x.strides[-1] != 4 and x.shape[-1] > 1:
                copied = True
                return np.empty(x.shape, np.float32) if out else np.ascontiguousarray(x)
            return x

        ins = [rows(x) for x in (dout, q, k, v)] + [_rank4(x[..., None]) for x in (lse, delta)]
        if bias is not None:
            bias = _rank4(bias)
            if bias.shape[-1] != k.shape[-2] or bias.strides[-1] != 4:
                bias = np.ascontiguousarray(np.broadcast_to(bias, (*bias.shape[:-1],
                                                                   k.shape[-2])))
                copied = True
            ins.append(bias)
        outs = [rows(x, out=True) for x in (dq, dk, dv)]
        return (*ins, *outs), outs, copied


def _rank4(x: np.ndarray) -> np.ndarray:
    if x.ndim == 4:
        return x
    if x.ndim < 4:
        return x.reshape((1,) * (4 - x.ndim) + x.shape)
    return x.reshape((-1, *x.shape[-3:]))  # a copy only when the batch dims do not merge


# The code that shapes the kernel's IR (part of its cache key).
_GENERATORS = ("tilefold.codegen.llvm.attention", "tilefold.codegen.llvm.vecmath",
               "tilefold.codegen.llvm")


@functools.cache
def attention_kernel(cfg: AttentionConfig | DecodeConfig, target: Target) -> AttentionKernel:
    """The compiled kernel for `cfg` (cached in process and, by generator fingerprint, on disk)."""
    name = f"tf_attention_{hashlib.sha256(repr(cfg).encode()).hexdigest()[:12]}"
    generate = decode.decode_ir if isinstance(cfg, DecodeConfig) else flash.attention_ir

    def make_ir() -> str:
        return generate(cfg, name, target.triple, target.features)

    layout = (DATA_OFFSET, DIMS_OFFSET, STRIDES_OFFSET)
    compiled = compile_generated(f"{source_digest(*_GENERATORS)}|{cfg!r}|{layout}", make_ir, target,
                                 name=name, uses_pool=cfg.threads > 1, opt_level=2)
    nobj = 4 + (cfg.mask != "none") + (isinstance(cfg, AttentionConfig) and cfg.lse)
    fn = compiled.function(name, None, *([ctypes.py_object] * nobj), ctypes.c_float)
    return AttentionKernel(cfg, fn, make_ir)


@functools.cache
def backward_kernel(cfg: BackwardConfig, target: Target) -> BackwardKernel:
    """The compiled attention backward for `cfg` (cached like `attention_kernel`)."""
    name = f"tf_attention_bw_{hashlib.sha256(repr(cfg).encode()).hexdigest()[:12]}"

    def make_ir() -> str:
        return backward.backward_ir(cfg, name, target.triple, target.features)

    layout = (DATA_OFFSET, DIMS_OFFSET, STRIDES_OFFSET)
    compiled = compile_generated(f"{source_digest(*_GENERATORS)}|{cfg!r}|{layout}", make_ir, target,
                                 name=name, uses_pool=cfg.threads > 1, opt_level=2)
    nobj = 10 if cfg.bias else 9
    fn = compiled.function(name, None, *([ctypes.py_object] * nobj), ctypes.c_float)
    return BackwardKernel(cfg, fn, make_ir)
