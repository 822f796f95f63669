"""The Python handle on the native worker pool: sizing, start-up, shutdown, and region costs."""

from __future__ import annotations

import atexit
import ctypes
import os
import statistics
import threading
import time
from dataclasses import dataclass

from tilefold.artifact.pool import env_int, pool_threads, worker_cpus
from tilefold.errors import UnsupportedError
from tilefold.runtime.build import build_module
from tilefold.runtime.compiled_module import CompiledModule
from tilefold.runtime.jit import register_runtime_symbol
from tilefold.runtime.pool_ir import MAX_THREADS, pool_ir
from tilefold.target import host_target

# Native entry points other generated modules may `declare` and call.
RUNTIME_SYMBOLS = ("tilefold_parallel", "tilefold_barrier", "tilefold_pool_size")
_DEFAULT_SPIN_US = 2000


def num_threads() -> int:
    """$TILEFOLD_NUM_THREADS, else the CPUs this process may run on."""
    return pool_threads(MAX_THREADS)


@dataclass(frozen=True)
class RegionCost:
    """Median microseconds per empty parallel region, from generated code and via ctypes."""

    nthreads: int
    native_us: float
    ctypes_us: float


class ThreadPool:
    """Workers 1..size-1 waiting natively; the calling thread always runs tid 0.

    Workers spin for $TILEFOLD_SPIN_US (default 2000) after each region, then sleep on a futex;
    each is pinned to its own CPU unless TILEFOLD_PIN=0 (unpinned spin/sleep pairs stall on VMs).
    A caller found on a worker's CPU runs its share of a region pinned to cpus[0] (its own mask
    restored after); elsewhere regions make no affinity syscalls.
    """

    def __init__(self, size: int):
        target = host_target()
        self.module: CompiledModule = build_module(
            pool_ir(target.arch), target, name="tilefold_pool"
        )
        self._parallel = self.module.function(
            "tilefold_parallel", None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32
        )
        self._park = self.module.function("tilefold_pool_park", None)
        self._bench = self.module.function(
            "tilefold_bench_regions", ctypes.c_int64, ctypes.c_int32, ctypes.c_int64
        )
        if _key_created.get(self.module.key) is None:
            rc = self.module.function("tilefold_pool_init", ctypes.c_int32)()
            if rc != 0:
                raise UnsupportedError(f"pthread_key_create failed ({rc}); too many thread keys")
            _key_created[self.module.key] = True
        cpus, worker_set = worker_cpus(size)
        spin_ns = env_int("TILEFOLD_SPIN_US", _DEFAULT_SPIN_US, 0) * 1000
        start = self.module.function(
            "tilefold_pool_start",
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
        )
        self.size: int = start(size, ctypes.addressof(cpus), ctypes.addressof(worker_set), spin_ns)
        self.closed = False
        for symbol in RUNTIME_SYMBOLS:
            register_runtime_symbol(symbol, self.module.address(symbol))

    def run(self, fn_address: int, ctx_address: int, nthreads: int) -> None:
        """Run fn(ctx, tid, n) for tid in 0..n-1 and return when all are done (n is clamped)."""
        self._parallel(fn_address, ctx_address, nthreads)

    def park(self) -> None:
        """Send spinning workers to sleep now, before another thread pool (PyTorch's OpenMP)
        takes the CPUs: a spinning worker would take half a core from it for the spin window."""
        self._park()

    def empty_region(self) -> None:
        """One region that does nothing on every thread: afterwards the workers spin, as they
        do between the kernels of a compiled graph."""
        self._parallel(self.module.address("tilefold_empty_region"), None, self.size)

    def region_cost(self, nthreads: int = 2, repeats: int = 2000) -> RegionCost:
        """Median cost of an empty region while warm: from native code, and through ctypes.

        Medians (native: of batches of 50) keep preemption by other processes out of the figure.
        """
        empty = self.module.address("tilefold_empty_region")
        for _ in range(100):
            self._parallel(empty, None, nthreads)
        batch = 50
        native = [self._bench(nthreads, batch) / batch for _ in range(max(1, repeats // batch))]
        calls = []
        for _ in range(repeats):
            start = time.perf_counter_ns()
            self._parallel(empty, None, nthreads)
            calls.append(time.perf_counter_ns() - start)
        return RegionCost(nthreads, statistics.median(native) / 1e3, statistics.median(calls) / 1e3)

    def shutdown(self) -> None:
        """Stop and join the workers; regions run on the caller alone until `thread_pool()`."""
        self.module.function("tilefold_pool_stop", None)()
        self.size = 1
        self.closed = True

    def _forget_after_fork(self) -> None:
        self.module.function("tilefold_pool_forget", None)()
        self.size = 1


_key_created: dict[str, bool] = {}
_pool: ThreadPool | None = None
_pool_lock = threading.Lock()


def thread_pool() -> ThreadPool:
    """The process's pool, started on first use (or after a shutdown) with `num_threads()`."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.closed:
            _pool = ThreadPool(num_threads())
            atexit.register(_pool.shutdown)
        return _pool


def park_workers() -> None:
    """Send the process's pool's spinning workers to sleep now, if it is running (starts none)."""
    pool = _pool
    if pool is not None and not pool.closed:
        pool.park()


def _after_fork_in_child() -> None:
    """The child has no workers: regions run serially until thread_pool() restarts them."""
    global _pool, _pool_lock
    _pool_lock = threading.Lock()
    if _pool is not None:
        _pool._forget_after_fork()
        atexit.unregister(_pool.shutdown)
        _pool = None


os.register_at_fork(after_in_child=_after_fork_in_child)
