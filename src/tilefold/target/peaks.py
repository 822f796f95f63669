"""Measured machine ceilings (multiply-accumulate peaks, read bandwidth), cached per machine."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tilefold.errors import UnsupportedError
from tilefold.target.amx import enable_amx
from tilefold.target.host import hardware_fingerprint, host_target
from tilefold.target.paths import atomic_write, cache_dir
from tilefold.target.probe_jit import probe_function
from tilefold.target.probes import peak_probe, read_probe_ir
from tilefold.target.target import Target

log = logging.getLogger("tilefold.target")
_PROBE_SECONDS = 0.05
_ROUNDS = 5
_DTYPE_ALIASES = {
    "amx-bf16": "amx-bf16",
    "amx-int8": "amx-int8",
    "f32": "f32",
    "float32": "f32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "int8": "int8",
    "i8": "int8",
    "u8": "int8",
}
_memory: dict[str, float] = {}
_file_lock = threading.Lock()


def _peaks_path() -> Path:
    return cache_dir() / "peaks.json"


def _load_all() -> dict:
    try:
        data = json.loads(_peaks_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember(key: str, value: float) -> float:
    """Merge one figure into peaks.json, keeping the best ever seen; returns that best.

    Noise (other processes, frequency dips) only ever lowers a ceiling measurement, so the
    maximum over probes converges on the truth. Writes are atomic; a lost race between two
    processes only loses one figure.
    """
    path = _peaks_path()
    with _file_lock:
        data = _load_all()
        figures = data.setdefault(hardware_fingerprint(), {})
        previous = figures.get(key)
        if isinstance(previous, (int, float)):
            value = max(value, float(previous))
        figures[key] = value
        _memory[key] = value
        try:
            atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode())
        except OSError as exc:
            log.warning("cannot record measured peaks in %s (%s)", path, exc)
    return value


def _recall(key: str) -> float | None:
    if key in _memory:
        return _memory[key]
    value = _load_all().get(hardware_fingerprint(), {}).get(key)
    if isinstance(value, (int, float)) and value > 0:
        _memory[key] = float(value)
        return float(value)
    return None


def _on_threads(work: Callable[[int], float], threads: int) -> list[float]:
    """Run work(index) on `threads` threads pinned to distinct CPUs; returns each one's seconds.

    ctypes releases the GIL, so the native probes run truly in parallel.
    """
    cpus = sorted(os.sched_getaffinity(0))
    start = threading.Barrier(threads)
    seconds = [0.0] * threads

    def runner(index: int) -> None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {cpus[index % len(cpus)]})  # this thread only
        start.wait()
        seconds[index] = work(index)

    pool = [threading.Thread(target=runner, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return seconds


def _best_rate(work: Callable[[int], float], threads: int, units: int) -> float:
    """Units/s of `threads` concurrent runs of `work` (each doing `units`): best of 5 rounds.

    Rates are summed per thread, so one thread preempted by another process costs its share
    of a round, not the whole round.
    """
    return max(sum(units / s for s in _on_threads(work, threads)) for _ in range(_ROUNDS))


def _check_threads(threads: int) -> int:
    if threads < 1:
        raise UnsupportedError(f"threads={threads}: measure with at least one thread")
    return threads


def measured_peak_gflops(
    target: Target | None = None, dtype: str = "f32", threads: int = 1, *, refresh: bool = False
) -> float:
    """Multiply-accumulate throughput in GFLOP/s (GOP/s for int8) from a register-only probe.

    The probe runs independent accumulator chains of the target's widest vector FMA (f32),
    `vdpbf16ps` (bf16) or `vpdpbusd` (int8), or four AMX tiles of `tdpbf16ps` (amx-bf16) or
    `tdpbssd` (amx-int8), for ~50 ms a thread; results are cached on disk by hardware
    fingerprint. `target` defaults to the host; narrowed hosts measure their own ISA.
    `refresh` probes again; the record keeps the best figure ever measured (see `_remember`).
    """
    target = target or host_target()
    kind_name = _DTYPE_ALIASES.get(getattr(dtype, "name", dtype))
    if kind_name is None:
        raise UnsupportedError(
            f"no peak probe for dtype {dtype!r}; use f32, bf16, int8, amx-bf16 or amx-int8"
        )
    threads = _check_threads(threads)
    probe = peak_probe(target, kind_name)
    # The probe's own text is part of the key: a figure a since-fixed probe measured is not kept.
    digest = hashlib.sha256(probe.ir.encode()).hexdigest()[:8]
    key = f"peak {kind_name} {target.cpu} {target.vector_bits}b x{threads} {digest}"
    cached = None if refresh else _recall(key)
    if cached is not None:
        return cached
    if kind_name.startswith("amx") and not enable_amx():
        raise UnsupportedError("this process may not use AMX (the kernel refused permission)")
    run = probe_function(
        probe.ir, target, "probe", None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p
    )
    inputs = np.frombuffer(bytearray(probe.inputs), np.uint8)
    out = np.zeros(probe.out_bytes, np.uint8)

    def timed(iters: int) -> float:
        start = time.perf_counter()
        run(iters, inputs.ctypes.data, out.ctypes.data)
        return time.perf_counter() - start

    calibration = 20_000
    spent = min(timed(calibration) for _ in range(2))
    iters = max(calibration, int(calibration * _PROBE_SECONDS / max(spent, 1e-9)))
    ops = iters * probe.ops_per_iteration
    gflops = _best_rate(lambda _: timed(iters), threads, ops) / 1e9
    log.info("measured %s: %.1f G/s", key, gflops)
    return _remember(key, gflops)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


def _stream_bytes(l3_bytes: int) -> int:
    """Four times the last-level cache (a stream that large misses it: each line is evicted
    before the stream comes back to it), at least 64 MiB and at most 512 MiB or 1/8 of
    physical memory. Touching the buffer's pages is most of the probe's time (several
    microseconds a page on a VM), so it is no larger than that."""
    return min(max(4 * l3_bytes, 64 << 20), 512 << 20, _physical_memory() // 8)


def dram_stream_bytes(l3_bytes: int) -> int:
    """A stream no cache keeps any of: 32 times the last-level cache, at least 1 GiB, at most
    1/8 of physical memory. A stream four times a victim L3 (Zen's) still hits in it now and
    then; this one is for probes off the cold path, whose buffer is touched once and read
    many times (`ReadProbe`)."""
    return min(max(32 * l3_bytes, 1 << 30), _physical_memory() // 8)


# (streams, vectors a stream per iteration, prefetch bytes ahead) of the read probes; the best
# rate is the ceiling.
READ_FORMS = ((1, 8, 0), (4, 2, 0), (1, 8, 512), (4, 2, 512))


def _read_rate(target: Target, data: np.ndarray, threads: int, streams: int, unroll: int,
               prefetch: int) -> float:
    """Bytes/s of `threads` threads each streaming its share of `data` in `streams` sections."""
    read = probe_function(read_probe_ir(target, streams, unroll, prefetch), target, "read",
                          ctypes.c_float, ctypes.c_void_p, ctypes.c_int64)
    block = target.vector_bits // 8 * unroll * streams  # bytes per loop iteration
    share = data.nbytes // (block * threads) * block

    def timed(index: int) -> float:
        start = time.perf_counter()
        read(data.ctypes.data + index * share, share // block)
        return time.perf_counter() - start

    return _best_rate(timed, threads, share)


def measured_bandwidth_gbps(threads: int = 1, *, refresh: bool = False) -> float:
    """Read-stream bandwidth from memory in GB/s (1e9 bytes/s), `threads` threads, cached.

    `refresh` probes again; the record keeps the best figure ever measured.
    """
    threads = _check_threads(threads)
    key = _bandwidth_key(threads)
    cached = None if refresh else _recall(key)
    return cached if cached is not None else _remember(key, ReadProbe(threads)())


class ReadProbe:
    """The read-stream bandwidth `threads` threads get now (GB/s, not recorded), over a buffer
    of `nbytes` touched once: on a shared host, a benchmark takes its samples in turn with
    its contenders' to say what the host gave them, beside the record that
    `measured_bandwidth_gbps` keeps."""

    def __init__(self, threads: int = 1, nbytes: int | None = None):
        self.threads = _check_threads(threads)
        self.target = host_target()
        nbytes = nbytes or _stream_bytes(self.target.l3_bytes)
        self.data = np.ones(nbytes // 4, np.float32)  # touched, so pages exist before timing

    def __call__(self) -> float:
        gbps = max(_read_rate(self.target, self.data, self.threads, *form)
                   for form in READ_FORMS) / 1e9
        log.info("probed read bandwidth x%d over %d MiB: %.1f GB/s", self.threads,
                 self.data.nbytes >> 20, gbps)
        return gbps


def _bandwidth_key(threads: int) -> str:
    """The record's key: the probes' code is part of it, so a changed probe measures anew."""
    probes = "".join(read_probe_ir(host_target(), *form) for form in READ_FORMS)
    return f"read-bandwidth x{threads} {hashlib.sha256(probes.encode()).hexdigest()[:8]}"
