"""GPU targets as data: what a code generator for an accelerator needs to know about the chip,
named entries with a fallback chain (`h200 -> h100 -> sm_90 -> sm_80`), and optional detection.

An entry either names a chip (all figures known) or a whole architecture (`sm_80`, `sm_90`,
`gfx942`: what every chip of it has; the chip-level figures are None). A chip's parent is the
chip it extends or its architecture, an architecture's parent the older architecture its code
still runs on; each chain ends at the oldest architecture tilefold knows for the vendor.

Figures are the vendors' published ones:
- A100 (SXM4 80GB): NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020) and the A100
  datasheet (108 SMs, 40 MB L2, 80 GB of HBM2e at 2,039 GB/s, 312 dense BF16 TFLOPS; tensor
  cores: FP64, TF32, BF16, FP16, INT8, INT4).
- H100 (SXM5): NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022) and the H100
  datasheet (132 SMs, 50 MB L2, 80 GB of HBM3 at 3.35 TB/s, 989 dense BF16 TFLOPS; FP8
  E4M3/E5M2 added, INT4 dropped).
- H200 (SXM): the H200 datasheet (2024): the H100's GH100 chip (132 SMs, 50 MB L2, 989 dense
  BF16 TFLOPS) with 141 GB of HBM3e at 4.8 TB/s.
- Shared memory a block may opt in to, per compute capability: CUDA C++ Programming Guide,
  "Technical Specifications per Compute Capability" (8.0: 163 KB, 9.0: 227 KB).
- MI300X: AMD CDNA 3 architecture whitepaper and the Instinct MI300X datasheet (304 compute
  units, 4 MB L2 per XCD x 8 XCDs = 32 MB, besides 256 MB of Infinity Cache, 192 GB of HBM3
  at 5.3 TB/s, 1,307 dense BF16 TFLOPS, 64 KB of LDS per workgroup, 64-wide wavefronts;
  matrix cores: FP64, FP32, TF32 (XF32), BF16, FP16, FP8 in AMD's FNUZ encodings, INT8).
Matrix-unit dtypes use tilefold's dtype names where it has the format ("tf32" and the FNUZ
FP8 encodings it does not have are named as the vendors do). Memory sizes are the vendors'
"GB", which count binary gigabytes (an 80 GB H100 holds 80 GiB of HBM).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import re
from dataclasses import dataclass

from tilefold.errors import UnsupportedError, lookup

KIB, MIB, GIB = 1024, 1024**2, 1024**3


@dataclass(frozen=True)
class GPUTarget:
    """One accelerator (or one architecture) to generate code for.

    `sm_count` is streaming multiprocessors (NVIDIA) or compute units (AMD);
    `shared_memory_per_block` the most a block (workgroup) may use, in bytes;
    `memory_bandwidth_gbps` the peak DRAM bandwidth in GB/s (10**9 bytes a second);
    `memory_bytes` the DRAM capacity; `matrix_tflops` the matrix units' dense peak at BF16, in
    TFLOP/s (10**12 flops a second): the roofline the distributed cost model prices ops on;
    `matrix_dtypes` the operand dtypes of the matrix units (tensor/matrix cores).
    """

    name: str
    vendor: str
    arch: str
    compute_capability: tuple[int, int] | None  # NVIDIA's; None for AMD
    warp_size: int
    shared_memory_per_block: int
    matrix_dtypes: frozenset[str]
    parent: str | None
    sm_count: int | None = None  # None for an architecture entry, and so below
    l2_bytes: int | None = None
    memory_bandwidth_gbps: float | None = None
    memory_bytes: int | None = None
    matrix_tflops: float | None = None
    family: tuple[str, ...] = ()  # filled from the parents when the table is built

    def has_matrix(self, dtype: str) -> bool:
        """Whether the matrix units take operands of `dtype` (e.g. "bf16", "fp8e4m3")."""
        return dtype in self.matrix_dtypes

    def __str__(self) -> str:
        chip = f", {self.sm_count} SMs" if self.sm_count else ""
        return f"{self.name} ({self.vendor} {self.arch}{chip})"


_SM80_MMA = frozenset({"f64", "tf32", "bf16", "f16", "i8", "i4"})
_SM90_MMA = frozenset({"f64", "tf32", "bf16", "f16", "fp8e4m3", "fp8e5m2", "i8"})
_GFX942_MMA = frozenset({"f64", "f32", "tf32", "bf16", "f16", "fp8e4m3fnuz", "fp8e5m2fnuz",
                         "i8"})

_ENTRIES = (
    GPUTarget("sm_80", "nvidia", "sm_80", (8, 0), 32, 163 * KIB, _SM80_MMA, None),
    GPUTarget("sm_90", "nvidia", "sm_90", (9, 0), 32, 227 * KIB, _SM90_MMA, "sm_80"),
    GPUTarget("a100", "nvidia", "sm_80", (8, 0), 32, 163 * KIB, _SM80_MMA, "sm_80",
              sm_count=108, l2_bytes=40 * MIB, memory_bandwidth_gbps=2039.0,
              memory_bytes=80 * GIB, matrix_tflops=312.0),
    GPUTarget("h100", "nvidia", "sm_90", (9, 0), 32, 227 * KIB, _SM90_MMA, "sm_90",
              sm_count=132, l2_bytes=50 * MIB, memory_bandwidth_gbps=3350.0,
              memory_bytes=80 * GIB, matrix_tflops=989.0),
    GPUTarget("h200", "nvidia", "sm_90", (9, 0), 32, 227 * KIB, _SM90_MMA, "h100",
              sm_count=132, l2_bytes=50 * MIB, memory_bandwidth_gbps=4800.0,
              memory_bytes=141 * GIB, matrix_tflops=989.0),
    GPUTarget("gfx942", "amd", "gfx942", None, 64, 64 * KIB, _GFX942_MMA, None),
    GPUTarget("mi300x", "amd", "gfx942", None, 64, 64 * KIB, _GFX942_MMA, "gfx942",
              sm_count=304, l2_bytes=32 * MIB, memory_bandwidth_gbps=5300.0,
              memory_bytes=192 * GIB, matrix_tflops=1307.0),
)
_BY_NAME = {entry.name: entry for entry in _ENTRIES}


def _chain(name: str) -> tuple[str, ...]:
    parent = _BY_NAME[name].parent
    return (name,) if parent is None else (name, *_chain(parent))


GPU_TARGETS: dict[str, GPUTarget] = {
    e.name: dataclasses.replace(e, family=_chain(e.name)) for e in _ENTRIES
}


def gpu_target_names() -> list[str]:
    """Every name `gpu_target` accepts."""
    return list(GPU_TARGETS)


def gpu_target(name: str) -> GPUTarget:
    """The GPU target called `name` (a chip such as "h100", or an architecture: "sm_90")."""
    return lookup(GPU_TARGETS, name, "GPU target", UnsupportedError)


def detect_gpu() -> GPUTarget | None:
    """The first GPU PyTorch sees, as its table entry with the device's own SM count and L2
    size; None when PyTorch is not installed, sees no GPU, or sees one the table lacks."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # only here: importing PyTorch takes seconds

    with contextlib.suppress(Exception):  # a broken driver is no GPU
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            entry = _entry_for(props.name, getattr(props, "gcnArchName", "") or "",
                               (props.major, props.minor))
            if entry is not None:
                return dataclasses.replace(
                    entry, sm_count=props.multi_processor_count,
                    l2_bytes=getattr(props, "L2_cache_size", None) or entry.l2_bytes)
    return None


def gpu_fingerprint(target: GPUTarget) -> str:
    """A short stable id of the GPU that runs `target`'s kernels, for keying GPU tuning results:
    the device's name, compute capability, SM count, driver and CUDA runtime versions (or, with
    no device, as under Triton's interpreter, the target's own figures and "no device"), and
    Triton's version. The CPU's `hardware_fingerprint` is a separate id."""
    parts = [target.name, str(target.compute_capability), str(target.sm_count)]
    parts += _device_parts() or ["no device"]
    with contextlib.suppress(ImportError):
        import triton

        parts.append(f"triton {triton.__version__}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _device_parts() -> list[str] | None:
    """What PyTorch reports of CUDA device 0 (None without PyTorch or a GPU)."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    with contextlib.suppress(Exception):  # a broken driver is no GPU
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            driver = getattr(torch._C, "_cuda_getDriverVersion", lambda: "?")()
            return [props.name, f"cc {props.major}.{props.minor}",
                    f"{props.multi_processor_count} SMs", f"driver {driver}",
                    f"cuda {torch.version.cuda}"]
    return None


def _entry_for(device: str, gcn_arch: str, capability: tuple[int, int]) -> GPUTarget | None:
    """The table entry for a device: its chip by name, else its exact architecture (no other:
    compute capability 8.6 runs sm_80 code but has 99 KB of shared memory a block, not 163)."""
    words = set(re.split(r"[^a-z0-9]+", device.lower()))  # "gh200" is not an "h200"
    chip = next((e for e in GPU_TARGETS.values() if e.sm_count is not None and e.name in words),
                None)
    if chip is not None:
        return chip
    arch = gcn_arch.split(":")[0] if gcn_arch else "sm_{}{}".format(*capability)
    entry = GPU_TARGETS.get(arch)
    return entry if entry is not None and entry.sm_count is None else None
