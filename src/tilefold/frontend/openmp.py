"""Sending PyTorch's OpenMP workers to rest before tilefold code runs beside them.

After a parallel op, PyTorch's OpenMP workers spin for milliseconds waiting for the next one;
tilefold's kernels running meanwhile get half a core less (the first GEMM of a partition after a
PyTorch `cumsum` lost about 10 ms). OpenMP 5's `omp_pause_resource_all(omp_pause_soft)` stops
them at once (0.1-0.3 ms, and PyTorch's next parallel op starts them again at no visible cost).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import logging
import os
from collections.abc import Callable

log = logging.getLogger("tilefold.frontend")
OMP_PAUSE_SOFT = 1


@functools.cache
def _pause_function() -> Callable[[int], int] | None:
    """`omp_pause_resource_all` of the OpenMP runtime PyTorch ships, or None without one."""
    import torch

    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for path in sorted(glob.glob(os.path.join(libdir, "lib*omp*.so*"))):
        try:
            fn = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        return fn
    log.info("tilefold: PyTorch's OpenMP runtime has no omp_pause_resource_all; its workers "
             "may spin beside tilefold's")
    return None


def pause_workers() -> None:
    """Stop PyTorch's OpenMP workers spinning (a no-op where the runtime cannot)."""
    fn = _pause_function()
    if fn is not None:
        fn(OMP_PAUSE_SOFT)
