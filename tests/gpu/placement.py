"""Where tests/gpu run their kernels: Triton's interpreter on CPU torch tensors (the default, and
CI's), or compiled for the CUDA device on CUDA tensors when TILEFOLD_GPU_DEVICE=1.

On the device the kernels are the ones a model runs: pipelined loops, real bf16 loads, stores
and dots (the interpreter widens bf16 to f32), so the same tests check them against the same
float64 references, at the tolerances of tests/tolerances.py for their dtypes and reduced
lengths. Asking for the device where there is none is an error, never a quiet interpreter run.
Tests mark what holds in one place only: `interpreter_only(why)` (skipped on the device) and
`device_only(why)` (skipped under the interpreter).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

ENV = "TILEFOLD_GPU_DEVICE"


def wants_device(environ: Mapping[str, str]) -> bool:
    """Whether `environ` asks for compiled kernels on a CUDA device (TILEFOLD_GPU_DEVICE set,
    not 0)."""
    return environ.get(ENV, "0").strip() not in ("", "0")


def cuda_problem() -> str | None:
    """Why this process cannot run compiled Triton kernels on a CUDA device, or None."""
    try:
        import torch
    except ImportError as exc:
        return f"torch cannot be imported ({exc})"
    if not torch.cuda.is_available():
        build = " (a CPU-only build)" if torch.version.cuda is None else ""
        return f"torch {torch.__version__}{build} sees no CUDA device"
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"Triton cannot be imported ({exc})"
    return None


def device_for(environ: Mapping[str, str], problem: Callable[[], str | None]) -> str:
    """The torch device the tests run on: "cpu" unless `environ` asks for the device, then
    "cuda" if `problem()` finds none; asked for with a problem, a `RuntimeError` saying what
    is missing and what to do (it must not fall back to the interpreter)."""
    if not wants_device(environ):
        return "cpu"
    why = problem()
    if why is not None:
        raise RuntimeError(f"{ENV}=1 runs tests/gpu compiled on a CUDA device, but {why}; "
                           f"run on a machine with an NVIDIA GPU, or unset {ENV} to run them "
                           "under Triton's interpreter on the CPU")
    return "cuda"


def skip_reason(on_device: bool, marks: Mapping[str, str]) -> str | None:
    """Why a test with `marks` (marker name -> its `why`) does not run here, or None."""
    if on_device and "interpreter_only" in marks:
        return (f"interpreter-only: tests Triton's interpreter's own behaviour "
                f"({marks['interpreter_only']}); {ENV}=1 runs compiled kernels")
    if not on_device and "device_only" in marks:
        return f"device-only: {marks['device_only']}; needs {ENV}=1 and a CUDA device"
    return None


ON_DEVICE = wants_device(os.environ)
DEVICE = "cuda" if ON_DEVICE else "cpu"  # conftest checks that the device is there


def tensor(a: Any) -> Any:
    """A torch tensor on the tests' device holding NumPy array `a` (made contiguous)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).to(DEVICE)


def host(t: Any) -> np.ndarray:
    """A torch tensor's values as a NumPy array on the host, in its dtype (bf16, which NumPy
    lacks, as f32)."""
    import torch

    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def f64(t: Any) -> np.ndarray:
    """A torch tensor's values as float64 NumPy on the host."""
    return t.detach().cpu().double().numpy()


def compiled_kernels(fn: Any) -> list[Any]:
    """The binaries Triton compiled for `fn` (a `triton.jit` function) in this process, on
    every device it ran on."""
    return [k for cache, *_ in getattr(fn, "device_caches", {}).values() for k in cache.values()]
