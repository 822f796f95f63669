"""Calibrating the alpha-beta collective model on the machine at hand (`tilefold tune --comm`):
all_reduce timed on `world` local torch.distributed ranks over a range of sizes, the ring
model fitted to the medians, and the result kept per hardware fingerprint, backend and world.

    ring all_reduce of B bytes over t ranks:  T(B) = 2(t-1) alpha + 2(t-1)/t B beta

The fit is least squares weighted by 1/T (relative error), so the small messages that fix
alpha count as much as the large ones that fix beta; both stay positive. Ranks are spawned
processes (gloo on CPU tensors, NCCL on CUDA ones), each timing `rounds` calls per size after a
warm-up, with a barrier before every call so all ranks start together; rank 0's medians count.
"""

from __future__ import annotations

import json
import math
import socket
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from tilefold.errors import TilefoldError, UnsupportedError
from tilefold.target import cache_dir, hardware_fingerprint
from tilefold.target.paths import atomic_write
from tilefold.version import __version__

SIZES = tuple(1 << p for p in range(12, 25, 2))  # 4 KiB .. 16 MiB
ROUNDS = 7


class CalibrationError(TilefoldError):
    """The collectives could not be timed (no torch.distributed, or the ranks failed)."""


@dataclass(frozen=True)
class Calibration:
    """A fitted link: `alpha` seconds per ring step, `beta` seconds per byte moved per rank,
    from medians `seconds[i]` of all_reduce of `sizes[i]` bytes on `world` ranks."""

    backend: str
    world: int
    alpha: float
    beta: float
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def all_reduce_seconds(self, nbytes: float) -> float:
        t = self.world
        return 2 * (t - 1) * self.alpha + 2 * (t - 1) / t * nbytes * self.beta

    def table(self) -> str:
        rows = [f"{'bytes':>10} {'measured ms':>12} {'model ms':>10} {'ratio':>6}"]
        for size, sec in zip(self.sizes, self.seconds, strict=True):
            model = self.all_reduce_seconds(size)
            rows.append(f"{size:>10} {sec * 1e3:>12.3f} {model * 1e3:>10.3f} "
                        f"{model / sec:>6.2f}")
        return "\n".join(rows)


def fit_ring(sizes, seconds, world: int) -> tuple[float, float]:
    """(alpha, beta) of the ring all_reduce model fitted to `seconds` (least squares on
    relative error); each at least 1e-12 so the model stays increasing."""
    sizes = np.asarray(sizes, np.float64)
    t = np.asarray(seconds, np.float64)
    design = np.stack([np.full_like(sizes, 2.0 * (world - 1)), 2.0 * (world - 1) / world * sizes],
                      axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return max(float(alpha), 1e-12), max(float(beta), 1e-12)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, backend: str, sizes, rounds: int,
               results) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        torch.set_num_threads(1)
        medians = []
        for size in sizes:
            x = torch.ones(max(1, size // 4), dtype=torch.float32)
            for _ in range(2):
                dist.all_reduce(x)
            times = []
            for _ in range(rounds):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(x)
                times.append(time.perf_counter() - start)
            medians.append(statistics.median(times))
        if rank == 0:
            results.put(medians)
    finally:
        dist.destroy_process_group()


def measure_all_reduce(world: int = 2, backend: str = "gloo", sizes=SIZES,
                       rounds: int = ROUNDS) -> list[float]:
    """Median seconds of an all_reduce of each of `sizes` bytes (f32) on `world` local ranks."""
    try:
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError:
        raise UnsupportedError("tune --comm needs PyTorch: pip install torch") from None
    if not dist.is_available() or (backend == "gloo" and not dist.is_gloo_available()):
        raise UnsupportedError(f"torch.distributed with {backend} is not available here")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    try:
        mp.start_processes(_rank_main, args=(world, _free_port(), backend, tuple(sizes), rounds,
                                             results), nprocs=world, join=True,
                           start_method="spawn")
    except Exception as exc:  # a rank failed: its traceback is in the message
        raise CalibrationError(f"timing all_reduce on {world} {backend} ranks failed: "
                               f"{exc}") from exc
    return list(results.get(timeout=60))


def calibrate(world: int = 2, backend: str = "gloo", sizes=SIZES,
              rounds: int = ROUNDS) -> Calibration:
    """Time all_reduce on `world` ranks and fit the ring model."""
    if world < 2:
        raise CalibrationError(f"calibrating a collective needs at least 2 ranks, got {world}")
    seconds = measure_all_reduce(world, backend, sizes, rounds)
    alpha, beta = fit_ring(sizes, seconds, world)
    return Calibration(backend, world, alpha, beta, tuple(sizes), tuple(seconds))


def store_path():
    return cache_dir() / "tuning" / "comm.json"


def _key(backend: str, world: int) -> str:
    return f"{hardware_fingerprint()} {backend} {world}"


def _read() -> dict:
    try:
        data = json.loads(store_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == 1 else {}


def save(cal: Calibration) -> None:
    """Keep `cal` under this machine's fingerprint (atomic replace of the whole file)."""
    data = _read() or {"schema": 1, "entries": {}}
    data["entries"][_key(cal.backend, cal.world)] = {**asdict(cal), "tilefold": __version__}
    atomic_write(store_path(), json.dumps(data, indent=1, sort_keys=True).encode())


def measured(backend: str = "gloo", world: int = 2) -> Calibration | None:
    """The calibration `tune --comm` recorded on this machine, if a valid one exists."""
    entry = _read().get("entries", {}).get(_key(backend, world))
    if not isinstance(entry, dict) or entry.get("tilefold") != __version__:
        return None
    try:
        cal = Calibration(entry["backend"], int(entry["world"]), float(entry["alpha"]),
                          float(entry["beta"]), tuple(entry["sizes"]), tuple(entry["seconds"]))
    except (KeyError, TypeError, ValueError):
        return None
    ok = all(math.isfinite(v) and v > 0 for v in (cal.alpha, cal.beta))
    return cal if ok else None
