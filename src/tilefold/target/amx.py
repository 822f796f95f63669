"""Linux makes each process ask before it may use AMX tiles; this asks, once."""

from __future__ import annotations

import ctypes
import functools
import logging
import platform

from tilefold.target.host_cpu import host_cpu

log = logging.getLogger("tilefold.target")

_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@functools.cache
def enable_amx() -> bool:
    """Request AMX tile-data permission for this process; True when AMX code may now run.

    Without it the first tile instruction kills the process with SIGILL. `compile_llvm_ir`
    calls it for modules that use AMX intrinsics; later calls are free. The real CPU decides,
    not a `TILEFOLD_HOST` narrowing: a named AMX target may still run on this machine.
    """
    if platform.system() != "Linux" or "amx-tile" not in host_cpu().features:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    status = libc.syscall(
        ctypes.c_long(_SYS_ARCH_PRCTL),
        ctypes.c_long(_ARCH_REQ_XCOMP_PERM),
        ctypes.c_long(_XFEATURE_XTILEDATA),
    )
    if status != 0:
        log.warning("the kernel refused AMX tile data (errno %d)", ctypes.get_errno())
    return status == 0
