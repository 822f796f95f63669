"""How many workers the native pool starts and the CPUs they are pinned to: the policy of the
process's pool (`runtime.thread_pool`) and of a loaded artifact's, in one place (NumPy-free,
LLVM-free, so the loader can use it)."""

from __future__ import annotations

import ctypes
import os

from tilefold.errors import UnsupportedError


def env_int(name: str, default: int, minimum: int) -> int:
    """$`name` as an integer >= `minimum`, `default` when unset."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise UnsupportedError(
            f"{name}={text!r} is not an integer >= {minimum}; set e.g. 2, or unset it"
        )
    return value


def pool_threads(max_threads: int) -> int:
    """$TILEFOLD_NUM_THREADS, else the CPUs this process may run on (at most `max_threads`)."""
    default = len(os.sched_getaffinity(0))
    return min(env_int("TILEFOLD_NUM_THREADS", default, 1), max_threads)


def worker_cpus(size: int) -> tuple[ctypes.Array, ctypes.Array]:
    """The CPU of each thread id (-1: unpinned; tid 0 is the caller, pinned only while it runs
    a region) and the 1024-bit set of the workers' CPUs, as `tilefold_pool_start` takes them.
    Every thread is pinned to its own allowed CPU unless TILEFOLD_PIN=0."""
    allowed = sorted(os.sched_getaffinity(0))
    pin = os.environ.get("TILEFOLD_PIN", "1") != "0"
    cpus = (ctypes.c_int32 * size)(*([-1] * size))
    for tid in range(size):
        cpu = allowed[tid % len(allowed)]
        cpus[tid] = cpu if pin and cpu < 1024 else -1
    worker_set = (ctypes.c_uint64 * 16)()
    for cpu in cpus[1:]:
        if cpu >= 0:
            worker_set[cpu // 64] |= 1 << (cpu % 64)
    return cpus, worker_set
