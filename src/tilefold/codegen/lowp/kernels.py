"""Low-precision GEMM micro-kernels as registry data: (ISA family, dtype, MR, NR, features, dot).

Entries sit beside the f32 ones of tilefold.codegen.gemm.registry and are chosen the same way,
walking the target's family chain; each dtype has a portable entry on "x86-64-v3" so every x86
target finds one (the fallbacks tests force with `host_target("x86-64-v3")`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilefold.errors import UnsupportedError


@dataclass(frozen=True)
class DotKernel:
    """C[MR, NR] += A_panel @ B_panel over k-groups of `kgroup` elements in 32-bit words."""

    name: str
    family: str
    dtype: str  # "bf16"/"f16" (x itself -> f32) or "u8s8" (u8 x s8 -> i32)
    mr: int
    nr: int
    lanes: int
    features: frozenset[str]
    dot: str  # key of tilefold.codegen.lowp.dot.DOT_STEPS
    kgroup: int

    @property
    def nv(self) -> int:
        return self.nr // self.lanes

    @property
    def acc_is_float(self) -> bool:
        return self.dtype != "u8s8"


def _f(*names: str) -> frozenset[str]:
    return frozenset(names)


DOT_KERNELS: tuple[DotKernel, ...] = (
    DotKernel("bf16_avx512bf16_8x48", "x86-64-v4", "bf16", 8, 48, 16,
              _f("avx512f", "avx512bf16"), "dpbf16", 2),
    DotKernel("bf16_avx512_6x48", "x86-64-v4", "bf16", 6, 48, 16, _f("avx512f"), "dpbf16_fma", 2),
    DotKernel("bf16_avx2_4x16", "x86-64-v3", "bf16", 4, 16, 8, _f("avx2", "fma"), "dpbf16_fma", 2),
    DotKernel("f16_avx512_6x48", "x86-64-v4", "f16", 6, 48, 16, _f("avx512f"), "dpf16_fma", 2),
    DotKernel("f16_avx2_4x16", "x86-64-v3", "f16", 4, 16, 8, _f("avx2", "fma", "f16c"),
              "dpf16_fma", 2),
    DotKernel("u8s8_avx512vnni_8x48", "x86-64-v4", "u8s8", 8, 48, 16,
              _f("avx512f", "avx512bw", "avx512vnni"), "dpbusd", 4),
    DotKernel("u8s8_avx512bw_6x32", "x86-64-v4", "u8s8", 6, 32, 16, _f("avx512bw"),
              "dpbusd_pmaddwd", 4),
    DotKernel("u8s8_avx2_3x16", "x86-64-v3", "u8s8", 3, 16, 8, _f("avx2"), "dpbusd_pmaddwd", 4),
)


def select_dot_kernel(target, dtype: str) -> DotKernel:
    """The first entry along the target's family chain whose features the target has."""
    for family in target.family:
        for entry in DOT_KERNELS:
            if entry.family == family and entry.dtype == dtype and target.has(*entry.features):
                return entry
    raise UnsupportedError(
        f"no {dtype} GEMM micro-kernel for target {target.name} (family {target.family}); "
        "low-precision GEMMs need x86-64-v3 (AVX2) or newer — convert the operands to f32 "
        "and use tilefold.matmul")
