"""Run the Triton GEMM template on torch tensors (CUDA, or CPU under TRITON_INTERPRET=1): batch
dims broadcast and flattened into strides, outputs allocated, split-K workspaces and the
reduce launch.

Triton's interpreter computes bf16 wrongly, so while interpreting a bf16 GEMM runs as an f32
one on f32 copies of its operands with the same strides (the same template, with an f32 dot),
and bf16 outputs are rounded once at the end; compiled code reads bf16 as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefold.codegen.rowprog.program import Program
from tilefold.codegen.triton.gemm import KERNEL, QUANTIZED, REDUCE, GemmSpec, emit_gemm
from tilefold.codegen.triton.gemm_config import GemmConfig
from tilefold.codegen.triton.launch import interpreting, load_jit, widened_f32
from tilefold.errors import ShapeError, UnsupportedError

TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16",
                "fp8e4m3": "float8_e4m3fn", "i8": "int8", "i4": "uint8"}


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, TORCH_DTYPES[name])


class TritonGemm:
    """The template for A of dtype `a` and B of dtype `b` (or "i8"/"i4" quantized weights),
    with an optional epilogue (see `GemmSpec`); `out_dtypes` are the outputs' dtypes, one per
    entry of `stores`. Call it with tensors; it returns the outputs, each [batch..., M, N]."""

    def __init__(self, a: str, b: str, *, epilogue: Program | None = None,
                 stores: tuple[int | None, ...] = (None,), c_round: str | None = None,
                 split: str = "none", out_dtypes: tuple[str, ...] = ("f32",)):
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
                             pipelined=not interp)
        self.source = emit_gemm(self.spec)
        self.fn = load_jit(self.source, KERNEL)
        self.reduce = load_jit(self.source, REDUCE) if split == "workspace" else None

    def _check(self, a: Any, b: Any, scale: Any) -> tuple[int, int, int]:
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
        if self.b in QUANTIZED and (scale is None or scale.dim() < 2 or k % scale.shape[-2] or
                                    scale.shape[-1] not in (1, b.shape[-1])):
            got = None if scale is None else list(scale.shape)
            raise ShapeError(f"{op}: quantized B {list(b.shape)} needs f32 scales "
                             f"[K / group, N or 1] with a group dividing K = {k}, got {got}")
        return m, b.shape[-1], k

    def __call__(self, a: Any, b: Any, *, scale: Any = None,
                 epilogue_inputs: Sequence[Any] = (), config: GemmConfig | None = None
                 ) -> list[Any]:
        import torch

        config = config or GemmConfig()
        if (config.split_k > 1) != (self.spec.split != "none"):
            raise UnsupportedError(f"Triton GEMM: config.split_k = {config.split_k} but the "
                                   f"template was made with split={self.spec.split!r}")
        m, n, k = self._check(a, b, scale)
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
        b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
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
            b3, _ = widened_f32(b3)
        if self.a == "fp8e4m3":  # the kernel loads its bytes and bitcasts them
            a3, b3 = a3.view(torch.uint8), b3.view(torch.uint8)
        extra = [t.contiguous().float() if interp and t.dtype == torch.bfloat16
                 else t.contiguous() for t in epilogue_inputs]
        if len(extra) != len(self.spec.inputs):
            raise UnsupportedError(f"Triton GEMM: the epilogue reads {len(self.spec.inputs)} "
                                   f"tensor(s), got {len(extra)}")
        if count and m and n:
            self._launch(a3, b3, scale, extra, results, (m, n, k), config)
        shaped = [r.reshape(*batch, m, n) for r in results]
        return [r.to(torch.bfloat16) if w else r for r, w in zip(shaped, wide, strict=True)]

    def _launch(self, a3, b3, scale, extra, results, mnk, config: GemmConfig) -> None:
        import torch

        m, n, k = mnk
        count = a3.shape[0]
        split = config.split_k
        k_iters = -(-_cdiv(k, config.block_k) // split)  # K steps per split
        quant = self.spec.b in QUANTIZED
        args: list[Any] = [a3, b3]
        qargs: list[int] = []
        if quant:
            scale = scale.expand(*scale.shape[:-1], n)  # one scale for every column: stride 0
            s3 = scale.float().reshape(-1, *scale.shape[-2:])
            if s3.shape[0] not in (1, count):
                raise ShapeError(f"Triton GEMM: scales {list(scale.shape)} have "
                                 f"{s3.shape[0]} batch entries for a batch of {count}")
            args.append(s3)
            qargs = [int(s3.stride(0)) if s3.shape[0] > 1 else 0, int(s3.stride(1)),
                     int(s3.stride(2))]
        work = None
        if self.spec.split == "workspace":
            work = torch.empty((split, count, m, n), dtype=torch.float32, device=a3.device)
            args.append(work)
            out_strides = list(work.stride())
        else:
            args += [*extra, *results]
            out_strides = [0, *results[0].stride()]
        args += [m, n, k, k_iters, *([k // scale.shape[-2]] if quant else []),
                 *map(int, a3.stride()), *map(int, b3.stride()), *qargs, *out_strides]
        with np.errstate(all="ignore"):  # the interpreter's NumPy, on lanes past the edge
            self.fn[config.grid(m, n, count)](
                *args, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                BLOCK_K=config.block_k, GROUP_M=config.group_m,
                num_warps=config.num_warps, num_stages=config.num_stages)
            if work is not None:
                self.reduce[config.grid(m, n, count)[:2]](
                    work, *extra, *results, m, n, *work.stride(), *results[0].stride(),
                    BLOCK_M=config.block_m, BLOCK_N=config.block_n, SPLIT_K=split,
                    num_warps=config.num_warps)


__all__ = ["TritonGemm"]
