"""A graph-IR memory-bound group compiled by the Triton backend for a GPU target, called on
torch tensors: the layout of each call signature is made as the CPU driver makes it
(`codegen/kernel/from_graph.py`), then one launch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from tilefold.codegen.kernel.from_graph import analyze_group, make_layout, row_major_strides
from tilefold.codegen.kernel.ir import Kernel
from tilefold.codegen.triton.launch import TritonLaunch
from tilefold.codegen.triton.schedule import GPUSchedule, choose_gpu_schedule
from tilefold.errors import UnsupportedError
from tilefold.ir import Block, Function, Value
from tilefold.ir.interpreter import bind_symbols
from tilefold.ir.types import SymDim
from tilefold.target.gpu import GPUTarget


@dataclass(frozen=True)
class _Array:
    """What `bind_symbols` reads of an argument."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass
class _Signature:
    args: list[Value]
    name: str


def _np_dtype(torch_dtype: Any) -> np.dtype:
    import torch

    table = {torch.float32: np.float32, torch.float16: np.float16,
             torch.bfloat16: ml_dtypes.bfloat16, torch.bool: np.bool_}
    if torch_dtype not in table:
        raise UnsupportedError(
            f"a Triton kernel takes f32/f16/bf16/bool tensors, not {torch_dtype}")
    return np.dtype(table[torch_dtype])


def _torch_dtype(dtype: np.dtype) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "bool": torch.bool}[np.dtype(dtype).name]


def _element_strides(t: Any) -> tuple[int, ...]:
    """As `from_graph.element_strides` for NumPy: 0 along size-1 dims, and an empty tensor
    laid out row-major (its own strides may be 0 along a dim, which would read as broadcast
    and let the kernel load it outside the loop that never runs)."""
    if t.numel() == 0:
        return row_major_strides(tuple(t.shape))
    return tuple(0 if n == 1 else s for n, s in zip(t.shape, t.stride(), strict=True))


class TritonGroup:
    """`group` (a memory-bound function or fused region) for `target`; call it with torch
    tensors on one device and get its outputs as fresh contiguous tensors there."""

    def __init__(self, group: Function | Block, target: GPUTarget):
        from tilefold.codegen.backend import get_backend

        self.target = target
        self.backend = get_backend("triton")
        self.group = analyze_group(group)
        self.params = list(group.args)
        self._compiled: dict[Any, tuple[Kernel, GPUSchedule, TritonLaunch]] = {}
        self._consts: dict[str, list[Any]] = {}  # the in-kernel constants, per device

    def kernel_for(self, *tensors: Any) -> tuple[Kernel, GPUSchedule]:
        """The kernel and schedule that run for these inputs."""
        kernel, schedule, _ = self._prepare(tensors)[0]
        return kernel, schedule

    def _prepare(self, tensors: Sequence[Any]):
        import torch

        grp = self.group
        arrays = [_Array(tuple(t.shape), _np_dtype(t.dtype)) for t in tensors]
        bindings = bind_symbols(_Signature(self.params, grp.name), arrays)
        sizes = {c: d if isinstance(d, int) else bindings[d.name] for c, d in grp.sizes.items()}
        device = tensors[0].device if tensors else torch.device("cpu")
        if str(device) not in self._consts:  # copied once a device (and none in a CUDA graph)
            self._consts[str(device)] = [
                torch.from_numpy(np.asarray(spec.value, np.float32)
                                 if spec.dtype == "bf16" else np.asarray(spec.value))
                .to(device=device, dtype=_torch_dtype(spec.value.dtype))
                for spec in grp.buffers if spec.value is not None]
        consts = self._consts[str(device)]
        outs = []
        for v in grp.outputs.values():
            shape = tuple(bindings[d.name] if isinstance(d, SymDim) else d for d in v.type.shape)
            outs.append(torch.empty(shape, dtype=_torch_dtype(v.type.dtype.np_dtype),
                                    device=device))
        buffers = [*tensors, *consts, *outs]
        layout, axis_sizes, axis_strides = make_layout(
            grp, sizes, [_element_strides(t) for t in buffers])
        if layout not in self._compiled:
            kernel = grp.kernel(layout)
            reason = self.backend.supports(kernel, self.target)
            if reason is not None:
                raise UnsupportedError(f"@{grp.name}: {reason}")
            schedule = choose_gpu_schedule(kernel, self.target)
            launch = self.backend.compile(kernel, schedule, self.target).entry
            self._compiled[layout] = (kernel, schedule, launch)
        return self._compiled[layout], buffers, axis_sizes, axis_strides, outs

    def __call__(self, *tensors: Any) -> list[Any]:
        (_, _, launch), buffers, sizes, strides, outs = self._prepare(tensors)
        launch(buffers, sizes, strides)
        return outs
