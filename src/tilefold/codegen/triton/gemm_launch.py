"""Run the Triton GEMM template on torch tensors (CUDA, or CPU under TRITON_INTERPRET=1): batch
dims broadcast and flattened into strides, outputs allocated, split-K workspaces and the
reduce launch.

Triton's interpreter computes bf16 wrongly, so while interpreting a bf16 GEMM runs as an f32
one on f32 copies of its operands with the same strides (the same template, with an f32 dot),
and bf16 outputs are rounded once at the end; compiled code reads bf16 as it is.

A persistent config (`GemmConfig.persistent`) runs the template's TMA variant, which the
tensor memory accelerator's rules limit to operands whose data starts on a 16-byte boundary,
whose rows are contiguous (A along K; B along N or, stored transposed, along K) and whose other
strides are multiples of 16 bytes (`tma_order` says which hold); a broadcast batch (stride 0)
becomes a descriptor of one batch entry, and a dim of size 1 takes a packed copy's stride.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefold.codegen.rowprog.program import Program
from tilefold.codegen.triton.gemm import KERNEL, REDUCE, GemmSpec, emit_gemm
from tilefold.codegen.triton.gemm_config import ELEMENT_BYTES, GemmConfig
from tilefold.codegen.triton.launch import (
    interpreting,
    load_jit,
    set_scratch_allocator,
    widened_f32,
)
from tilefold.errors import ShapeError, UnsupportedError

TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16",
                "fp8e4m3": "float8_e4m3fn", "i8": "int8", "u8": "uint8", "i4": "uint8"}


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, TORCH_DTYPES[name])


MAX_GRID_Y = 65535  # programs along a CUDA grid's axis 1 (the batch here)
TMA_ALIGN = 16  # bytes: the tensor memory accelerator's alignment of addresses and strides


def _flat(a: Any, b: Any) -> tuple[Any, Any, tuple[int, ...]]:
    """A and B with their batch dims broadcast and flattened: [count, M, K], [count, K', N]."""
    import torch

    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    return a3, b3, tuple(batch)


def _strides_ok(name: str, t: Any, dims: tuple[int, ...], size: int) -> str | None:
    """Why `t`'s strides along `dims` do not suit a descriptor (None: they do): each a multiple
    of 16 bytes, a batch stride of 0 and any stride of a dim of size 1 allowed too."""
    for d in dims:
        stride = int(t.stride(d))
        if t.shape[d] == 1 or (d == 0 and stride == 0) or (stride > 0 and
                                                          stride * size % TMA_ALIGN == 0):
            continue
        return (f"{name} {list(t.shape)}'s stride {stride} along dim {d} is {stride * size} "
                f"bytes, not a positive multiple of {TMA_ALIGN}")
    return None


def tma_order(a3: Any, b3: Any, dtype: str) -> tuple[str | None, str]:
    """B's memory order for the persistent TMA variant ("kn": rows along N, "nk": stored
    transposed) when flattened A [count, M, K] and B [count, K, N] whose dot reads `dtype`
    suit tensor descriptors; else None and why not."""
    size = ELEMENT_BYTES[dtype]
    if 0 in (*a3.shape, *b3.shape):  # a descriptor's dims are >= 1
        return None, f"A {list(a3.shape)} or B {list(b3.shape)} is empty"
    for name, t in (("A", a3), ("B", b3)):
        if t.data_ptr() % TMA_ALIGN:
            return None, f"{name}'s data does not start on a {TMA_ALIGN}-byte boundary"
    if a3.stride(2) != 1 and a3.shape[2] != 1:
        return None, f"A {list(a3.shape)}'s rows do not run along K (stride {a3.stride(2)})"
    why = _strides_ok("A", a3, (0, 1), size)
    if why is not None:
        return None, why
    if b3.stride(2) == 1 or b3.shape[2] == 1:
        order, dims = "kn", (0, 1)
    elif b3.stride(1) == 1 or b3.shape[1] == 1:
        order, dims = "nk", (0, 2)
    else:
        return None, (f"B {list(b3.shape)} is contiguous along neither N nor K (strides "
                      f"{list(b3.stride())})")
    why = _strides_ok("B", b3, dims, size)
    return (None, why) if why is not None else (order, "")


def _descriptor_strides(t: Any, dims: tuple[int, ...], size: int) -> list[int]:
    """`t`'s strides (elements) as a descriptor over its `dims` (outer to inner, the innermost
    contiguous) takes them: a dim of one entry, or a broadcast batch (which the descriptor
    holds once), gets the stride a packed copy would have, rounded up to 16 bytes."""
    unit = TMA_ALIGN // size
    strides = {d: int(t.stride(d)) for d in range(t.dim())}
    for inner, d in zip(dims[::-1], dims[-2::-1], strict=False):
        if t.shape[d] == 1 or not strides[d]:
            strides[d] = -(-(strides[inner] if inner != dims[-1] else 1) * t.shape[inner]
                           // unit) * unit
    return [strides[d] for d in range(t.dim())]


class TritonGemm:
    """The template for A of dtype `a` and B of dtype `b` (or quantized weights: "i8", "u8",
    "i4" packed two a byte, or "fp8e4m3" under a wider A; with zero points when `zero_point`),
    with an optional epilogue (see `GemmSpec`); `out_dtypes` are the outputs' dtypes, one per
    entry of `stores`. Call it with tensors; it returns the outputs, each [batch..., M, N]."""

    def __init__(self, a: str, b: str, *, epilogue: Program | None = None,
                 stores: tuple[int | None, ...] = (None,), c_round: str | None = None,
                 split: str = "none", out_dtypes: tuple[str, ...] = ("f32",),
                 zero_point: bool = False, fp8_fast_accum: bool = False):
        if len(out_dtypes) != len(stores):
            raise UnsupportedError(f"Triton GEMM: {len(stores)} stored value(s) but "
                                   f"{len(out_dtypes)} output dtype(s)")
        if split == "atomic" and out_dtypes != ("f32",):
            raise UnsupportedError("Triton GEMM: atomic split-K adds f32 partial sums into C, "
                                   f"so C must be f32, not {out_dtypes[0]}")
        self.a, self.b, self.out_dtypes = a, b, out_dtypes
        interp = interpreting()
        dot = "f32" if interp and a == "bf16" else a  # the interpreter's bf16 is wrong
        self.spec = GemmSpec(dot, dot if b == a else b, epilogue, stores, c_round, split,
                             pipelined=not interp, zero_point=zero_point,
                             fp8_fast_accum=fp8_fast_accum)
        self.source = emit_gemm(self.spec)
        self.fn = load_jit(self.source, KERNEL)
        self.reduce = load_jit(self.source, REDUCE) if split == "workspace" else None
        self._variants: dict[str, tuple[GemmSpec, Any]] = {}  # TMA ones, by B's order

    def _check(self, a: Any, b: Any, scale: Any, zero: Any) -> tuple[int, int, int]:
        op = f"Triton GEMM ({self.a} x {self.b})"
        if a.dim() < 2 or b.dim() < 2:
            raise ShapeError(f"{op}: A {list(a.shape)} and B {list(b.shape)} need rank >= 2 "
                             "(a vector operand is a GEMV: give it a unit dim)")
        for name, t, want in (("A", a, self.a), ("B", b, self.b)):
            if t.dtype != _torch_dtype(want):
                raise UnsupportedError(f"{op}: {name} is {t.dtype}, expected "
                                       f"{_torch_dtype(want)}")
        m, k = a.shape[-2:]
        kb = b.shape[-2] * (2 if self.b == "i4" else 1)
        if kb != k:
            raise ShapeError(f"{op}: A {list(a.shape)} has K = {k} but B {list(b.shape)} "
                             f"holds {kb} rows of K{' (two int4 codes a byte)' * (self.b == 'i4')}")
        quant = self.spec.dequantizes
        if quant and (scale is None or scale.dim() < 2 or k % scale.shape[-2] or
                      scale.shape[-1] not in (1, b.shape[-1])):
            got = None if scale is None else list(scale.shape)
            raise ShapeError(f"{op}: quantized B {list(b.shape)} needs f32 scales "
                             f"[K / group, N or 1] with a group dividing K = {k}, got {got}")
        if self.spec.zero_point != (zero is not None) or \
                (zero is not None and zero.shape != scale.shape):
            raise ShapeError(f"{op}: zero points must be given exactly when the template has "
                             "them, with the scales' shape")
        return m, b.shape[-1], k

    def __call__(self, a: Any, b: Any, *, scale: Any = None, zero_point: Any = None,
                 epilogue_inputs: Sequence[Any] = (), config: GemmConfig | None = None
                 ) -> list[Any]:
        import torch

        config = config or GemmConfig()
        if (config.split_k > 1) != (self.spec.split != "none"):
            raise UnsupportedError(f"Triton GEMM: config.split_k = {config.split_k} but the "
                                   f"template was made with split={self.spec.split!r}")
        m, n, k = self._check(a, b, scale, zero_point)
        a3, b3, batch = _flat(a, b)
        order = self._tma(a3, b3, config)
        count = a3.shape[0]
        device = a.device
        interp = interpreting()
        alloc = torch.zeros if self.spec.split == "atomic" else torch.empty
        wide = [interp and d == "bf16" for d in self.out_dtypes]
        results = [alloc((count, m, n), device=device,
                        dtype=torch.float32 if w else _torch_dtype(d))
                   for d, w in zip(self.out_dtypes, wide, strict=True)]
        if interp and self.a == "bf16":
            a3, _ = widened_f32(a3)
        if interp and self.b == "bf16":
            b3, _ = widened_f32(b3)
        if interp and order is None:  # the interpreter's kernel bitcasts fp8 bytes
            a3 = a3.view(torch.uint8) if self.a == "fp8e4m3" else a3
            b3 = b3.view(torch.uint8) if self.b == "fp8e4m3" else b3
        extra = [t.contiguous().float() if interp and t.dtype == torch.bfloat16
                 else t.contiguous() for t in epilogue_inputs]
        if len(extra) != len(self.spec.inputs):
            raise UnsupportedError(f"Triton GEMM: the epilogue reads {len(self.spec.inputs)} "
                                   f"tensor(s), got {len(extra)}")
        if count and m and n:
            if order is None:
                self._launch(a3, b3, (scale, zero_point), extra, results, (m, n, k), config)
            else:
                self._launch_tma(order, a3, b3, extra, results, (m, n, k), config)
        shaped = [r.reshape(*batch, m, n) for r in results]
        return [r.to(torch.bfloat16) if w else r for r, w in zip(shaped, wide, strict=True)]

    def tma_order(self, a: Any, b: Any) -> str | None:
        """B's memory order when the persistent TMA variant can run on A and B (tensors as
        `__call__` takes them), else None: see `tma_order`."""
        if self.spec.dequantizes or self.spec.split != "none":
            return None
        a3, b3, _ = _flat(a, b)
        return tma_order(a3, b3, self.a)[0]

    def _tma(self, a3: Any, b3: Any, config: GemmConfig) -> str | None:
        """The TMA variant's B order for a persistent `config` (None for one that is not);
        `UnsupportedError` naming the operand when the operands do not suit descriptors."""
        if not config.persistent:
            return None
        op = f"Triton GEMM ({self.a} x {self.b})"
        if self.spec.dequantizes or self.spec.split != "none":
            raise UnsupportedError(f"{op}: the persistent TMA variant copies A and B as they "
                                   "are, with no K split; use a config with persistent=0")
        order, why = tma_order(a3, b3, self.a)
        if order is None:
            raise UnsupportedError(f"{op}: the persistent TMA variant needs operands the "
                                   f"tensor memory accelerator can copy: {why}; use a config "
                                   "with persistent=0 (or a contiguous copy)")
        return order

    def variant(self, order: str) -> tuple[GemmSpec, Any]:
        """The persistent TMA variant's spec and kernel for B's memory `order`."""
        if order not in self._variants:
            spec = dataclasses.replace(self.spec, tma=order)
            self._variants[order] = (spec, load_jit(emit_gemm(spec), KERNEL))
        return self._variants[order]

    def _launch_tma(self, order, a3, b3, extra, results, mnk, config: GemmConfig) -> None:
        m, n, k = mnk
        count = a3.shape[0]
        _, fn = self.variant(order)
        size = ELEMENT_BYTES[self.spec.a]  # of what the kernel reads (f32 copies: aligned too)
        a_batch, b_batch = (count if t.stride(0) and count > 1 else 1 for t in (a3, b3))
        strides = [*_descriptor_strides(a3, (0, 1, 2), size),
                   *_descriptor_strides(b3, (0, 1, 2) if order == "kn" else (0, 2, 1), size)]
        grid = config.grid(m, n, count)
        set_scratch_allocator(a3.device)  # where Triton builds the descriptors on a GPU
        with np.errstate(all="ignore"):  # the interpreter's NumPy, on lanes past the edge
            fn[grid](a3, b3, *extra, *results, m, n, k, _cdiv(k, config.block_k), *strides,
                     0, *results[0].stride(), count, a_batch, b_batch, grid[0],
                     BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                     GROUP_M=config.group_m, num_warps=config.num_warps,
                     num_stages=config.num_stages)

    def _launch(self, a3, b3, blocks, extra, results, mnk, config: GemmConfig) -> None:
        import torch

        m, n, k = mnk
        count = a3.shape[0]
        split = config.split_k
        k_iters = -(-_cdiv(k, config.block_k) // split)  # K steps per split
        args: list[Any] = [a3, b3]
        qargs: list[int] = []
        scale = blocks[0]
        for t in blocks if self.spec.dequantizes else ():
            if t is None:
                continue
            t3 = _per_batch(t.float() if t is scale else t, count, n)
            args.append(t3)
            qargs += [int(t3.stride(0)) if t3.shape[0] > 1 else 0, int(t3.stride(1)),
                      int(t3.stride(2))]
        work = None
        if self.spec.split == "workspace":
            work = torch.empty((split, count, m, n), dtype=torch.float32, device=a3.device)
            args.append(work)
            out_strides = list(work.stride())
        else:
            args += [*extra, *results]
            out_strides = [0, *results[0].stride()]
        args += [m, n, k, k_iters, *([k // scale.shape[-2]] if scale is not None else []),
                 *map(int, a3.stride()), *map(int, b3.stride()), *qargs, *out_strides]
        for first in range(0, count, MAX_GRID_Y):  # grid axis 1 holds at most 65,535
            grid = config.grid(m, n, min(MAX_GRID_Y, count - first))
            with np.errstate(all="ignore"):  # the interpreter's NumPy, on lanes past the edge
                self.fn[grid](
                    *args, first, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                    BLOCK_K=config.block_k, GROUP_M=config.group_m,
                    num_warps=config.num_warps, num_stages=config.num_stages)
                if work is not None:
                    self.reduce[grid[:2]](
                        work, *extra, *results, m, n, *work.stride(), *results[0].stride(),
                        first, BLOCK_M=config.block_m, BLOCK_N=config.block_n, SPLIT_K=split,
                        num_warps=config.num_warps)


def _per_batch(t: Any, count: int, n: int) -> Any:
    """Scales or zero points [..., K / group, N or 1] as [1 or count, K / group, N]."""
    t3 = t.expand(*t.shape[:-1], n).reshape(-1, *t.shape[-2:-1], n)  # one for all N: stride 0
    if t3.shape[0] not in (1, count):
        raise ShapeError(f"Triton GEMM: scales {list(t.shape)} have {t3.shape[0]} batch "
                         f"entries for a batch of {count}")
    return t3


__all__ = ["TritonGemm", "tma_order"]
