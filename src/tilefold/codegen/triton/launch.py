"""Load generated Triton source and launch it on torch tensors (CUDA, or CPU under
TRITON_INTERPRET=1).

Triton reads a kernel's source through `inspect`, so the text is written to a file in the
cache folder named by its digest and imported from there. Triton's interpreter computes bf16
wrongly, so while interpreting, bf16 buffers are widened to f32 copies with the same strides
for the launch (outputs copied back, rounding to bf16 once): the kernel code is the same, its
loads and stores convert to whatever their pointers hold.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefold.codegen.kernel.ir import Kernel
from tilefold.codegen.triton.emit import ident, kernel_params
from tilefold.codegen.triton.schedule import GPUSchedule
from tilefold.errors import UnsupportedError
from tilefold.target.paths import atomic_write, cache_dir

_LOADED: dict[tuple[str, bool], Any] = {}


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def require_triton() -> None:
    """Raise a clear error when Triton is not installed."""
    try:
        import triton  # noqa: F401
    except ImportError:
        raise UnsupportedError("the Triton backend needs Triton: pip install 'tilefold[triton]'"
                               " (or pip install triton)") from None


def load_jit(source: str, name: str) -> Any:
    """The `@triton.jit` function `name` that `source` defines, imported once per process and
    interpreter setting (`triton.jit` reads TRITON_INTERPRET when the source is loaded).

    Compiling needs a process where Triton was imported without TRITON_INTERPRET (its own
    library functions are interpreted ones otherwise), so `ptx.py` compiles in a child process
    while interpreting; generated kernels call none of those library functions, so they run
    under the interpreter however Triton was imported."""
    require_triton()
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    key = (digest, interpreting())
    if key not in _LOADED:
        path = cache_dir() / "triton" / f"{ident(name)}_{digest}.py"
        if not path.exists() or path.read_text() != source:
            atomic_write(path, source.encode())
        spec = importlib.util.spec_from_file_location(
            f"tilefold_triton_{digest}_{int(key[1])}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED[key] = module
    return getattr(_LOADED[key], ident(name))  # a source may define several kernels


def set_scratch_allocator(device: Any) -> None:
    """Give Triton the global scratch memory that kernels building tensor descriptors in the
    kernel (`tl.make_tensor_descriptor`) need at launch on a GPU: torch bytes on `device`.
    Triton keeps the allocator in a context variable, so it is set before each such launch
    (a thread starts with none); the interpreter needs none."""
    if interpreting() or getattr(device, "type", "cuda") != "cuda":
        return
    import torch
    import triton

    def allocate(size: int, alignment: int, stream: Any) -> Any:
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(allocate)


def widened_f32(t: Any) -> tuple[Any, Any]:
    """An f32 tensor with `t`'s sizes and strides over an f32 copy of the memory `t` spans
    (so broadcast and strided views stay valid), and that span of `t` itself."""
    import torch

    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) \
        if t.numel() else 0
    flat = torch.as_strided(t, (span,), (1,))
    wide = flat.float()
    return torch.as_strided(wide, tuple(t.shape), tuple(t.stride())), flat


class TritonLaunch:
    """The compiled kernel: call it with one torch tensor per kernel buffer (in the kernel's
    buffer order), each kernel axis' size, and each buffer's stride (elements) per axis."""

    def __init__(self, kernel: Kernel, schedule: GPUSchedule, fn: Any):
        self.kernel, self.schedule, self.fn = kernel, schedule, fn
        self._params = kernel_params(kernel)

    def geometry(self, sizes: Sequence[int]) -> tuple[int, int]:
        """(rows, columns) of the launch for these axis sizes."""
        k, s = self.kernel, self.schedule
        rows = math.prod(sizes[k.axis_index(a)] for a in s.row_axes)
        return rows, math.prod(sizes[k.axis_index(a)] for a in s.col_axes)

    def __call__(self, tensors: Sequence[Any], sizes: Sequence[int],
                 strides: Sequence[Sequence[int]]) -> None:
        k, s = self.kernel, self.schedule
        n_rows, n_cols = self.geometry(sizes)
        if n_rows == 0 or (n_cols == 0 and not s.loop_cols):
            return
        shape = s.launch(n_rows, n_cols)
        block_r, block_c = shape.block_r, shape.block_c
        blocks = -(-n_rows // block_r) * (1 if s.loop_cols else -(-n_cols // block_c))
        import torch

        passed, copy_back = list(tensors), []
        if interpreting():
            for i, t in enumerate(tensors):
                if t.dtype == torch.bfloat16:
                    passed[i], flat = widened_f32(t)
                    if k.buffers[i].output:
                        copy_back.append((flat, passed[i]))
        index = {b.name: i for i, b in enumerate(k.buffers)}
        args = []
        for p in self._params:
            if p[0] == "ptr":
                args.append(passed[index[p[1]]])
            elif p[0] == "size":
                args.append(int(sizes[k.axis_index(p[1])]))
            else:
                args.append(int(strides[index[p[1]]][k.axis_index(p[2])]))
        with np.errstate(all="ignore"):  # the interpreter's NumPy, on lanes past the edge
            self.fn[(blocks,)](*args, n_rows, n_cols, BLOCK_R=block_r, BLOCK_C=block_c,
                               ONE_PASS=shape.one_pass, num_warps=shape.num_warps)
        for flat, wide in copy_back:
            span = flat.shape[0]
            flat.copy_(torch.as_strided(wide, (span,), (1,)))
