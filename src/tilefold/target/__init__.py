"""What the hardware is: ISA features, registers, caches and measured peaks, detected or named;
GPUs as data (`gpu.py`)."""

from tilefold.target.amx import enable_amx
from tilefold.target.gpu import GPUTarget, detect_gpu, gpu_target, gpu_target_names
from tilefold.target.host import hardware_fingerprint, host_target, named_target
from tilefold.target.machine import target_machine
from tilefold.target.paths import cache_dir
from tilefold.target.peaks import measured_bandwidth_gbps, measured_peak_gflops
from tilefold.target.table import target_names
from tilefold.target.target import Target

__all__ = [
    "GPUTarget",
    "Target",
    "cache_dir",
    "detect_gpu",
    "enable_amx",
    "gpu_target",
    "gpu_target_names",
    "hardware_fingerprint",
    "host_target",
    "measured_bandwidth_gbps",
    "measured_peak_gflops",
    "named_target",
    "target_machine",
    "target_names",
]
