"""What the hardware is: ISA features, registers, caches and measured peaks, detected or named;
GPUs as data (`gpu.py`).

Names are imported on first use: `target.paths` (where the caches lie) is asked for by processes
that run saved artifacts and never detect a CPU through LLVM.
"""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {
    "enable_amx": "amx", "GPUTarget": "gpu", "detect_gpu": "gpu", "gpu_target": "gpu",
    "gpu_target_names": "gpu", "hardware_fingerprint": "host", "host_target": "host",
    "named_target": "host", "target_machine": "machine", "cache_dir": "paths",
    "measured_bandwidth_gbps": "peaks", "measured_peak_gflops": "peaks",
    "target_names": "table", "Target": "target",
}

__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module 'tilefold.target' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tilefold.target.{_FROM[name]}"), name)
    globals()[name] = value
    return value
