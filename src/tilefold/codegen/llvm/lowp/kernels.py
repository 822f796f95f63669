"""Low-precision GEMM micro-kernels as registry data: (ISA family, dtype, MR, NR, features, dot).

Entries sit beside the f32 ones of tilefold.codegen.llvm.gemm.registry and are chosen by the same
selector (`select_entry`), walking the target's family chain; each dtype has a portable entry
on "x86-64-v3" so every x86 target finds one (the fallbacks tests force with
`host_target("x86-64-v3")`). An entry whose `dot` is WIDEN_TO_F32 is the f32 GEMM run on
operands widened to f32 while packed. AMX tile entries come first where the CPU has them and
the OS lets this process use them; signed 8-bit A ("s8s8") runs on a u8s8 kernel where no
s8s8 kernel applies: as A + 128, compensated, on kernels that read bytes, or sign-extended to s16
(exact, no compensation) on the AVX2 row whose packing widens both operands' codes to s16.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from tilefold.codegen.llvm.gemm.registry import missing_features, select_entry
from tilefold.errors import UnsupportedError
from tilefold.target import Target, enable_amx

log = logging.getLogger("tilefold.codegen.llvm.lowp")
WIDEN_TO_F32 = "widen_to_f32"
# K-group words of one chunk of a packed A panel (an AMX tile's row); K is padded to whole chunks.
CHUNK_WORDS = 16


@dataclass(frozen=True)
class DotKernel:
    """C[MR, NR] += A_panel @ B_panel over k-groups of `kgroup` elements in 32-bit words."""

    name: str
    family: str
    dtype: str  # "bf16"/"f16" (x itself -> f32), "u8s8"/"s8s8" (u8/s8 x s8 -> i32)
    mr: int
    nr: int
    lanes: int
    features: frozenset[str]
    dot: str  # key of tilefold.codegen.llvm.lowp.dot.DOT_STEPS, an AMX instruction, or WIDEN_TO_F32
    kgroup: int  # codes a 32-bit word: 4 bytes, 2 bf16/f16/s16 (8-bit widened), 1 (f32 rows)

    @property
    def nv(self) -> int:
        return self.nr // self.lanes

    @property
    def a_in_l1(self) -> bool:
        """Blocking's loop order (tilefold.codegen.gemm.blocking): the B micro-panel stays in L1."""
        return False

    @property
    def a_direct(self) -> bool:
        """Blocking's A layout: A is always packed (never read in place)."""
        return False

    def k_words(self, k: int) -> int:
        """32-bit k-group words of K elements, padded to whole chunks (how panels hold K)."""
        return math.ceil(math.ceil(k / self.kgroup) / CHUNK_WORDS) * CHUNK_WORDS

    @property
    def acc_is_float(self) -> bool:
        return self.dtype in ("bf16", "f16")

    @property
    def s16_codes(self) -> bool:
        """An 8-bit kernel whose packing widens A (u8 or s8) and B (s8) to s16 k-pairs, the
        bf16 pair layout (kgroup 2): its dot step multiplies s16 and never sees a byte."""
        return self.dtype in ("u8s8", "s8s8") and self.kgroup == 2

    @property
    def shifts_signed_a(self) -> bool:
        """Signed A runs on this vector kernel of u8 quads as A + 128, less 128 * colsum(B)
        (AMX has its own s8s8 rows; s16 codes hold s8 exactly)."""
        return self.dtype == "u8s8" and not self.s16_codes and not self.is_amx

    @property
    def widens(self) -> bool:
        """Runs on the f32 GEMM (tilefold.codegen.llvm.gemm) with A and B widened while packed; the
        tile fields then describe the f32 micro-kernel of that family."""
        return self.dot == WIDEN_TO_F32

    @property
    def driver(self) -> str:
        """The GEMM that runs this row: "f32" (the f32 GEMM on widened operands) or "lowp"
        (tilefold.codegen.llvm.lowp.driver, around the row's micro-kernel)."""
        return "f32" if self.widens else "lowp"

    @property
    def is_amx(self) -> bool:
        """Tile kernels (tilefold.codegen.llvm.lowp.microkernel.TileBlock), not vector dot steps."""
        return "amx-tile" in self.features


def _f(*names: str) -> frozenset[str]:
    return frozenset(names)


DOT_KERNELS: tuple[DotKernel, ...] = (
    DotKernel("bf16_amx_16x32", "sapphirerapids", "bf16", 16, 32, 16, _f("amx-tile", "amx-bf16"),
              "tdpbf16ps", 2),
    DotKernel("u8s8_amx_16x32", "sapphirerapids", "u8s8", 16, 32, 16, _f("amx-tile", "amx-int8"),
              "tdpbusd", 4),
    DotKernel("s8s8_amx_16x32", "sapphirerapids", "s8s8", 16, 32, 16, _f("amx-tile", "amx-int8"),
              "tdpbssd", 4),
    DotKernel("bf16_avx512bf16_8x48", "x86-64-v4", "bf16", 8, 48, 16,
              _f("avx512f", "avx512bf16"), "dpbf16", 2),
    DotKernel("bf16_avx512_6x48", "x86-64-v4", "bf16", 6, 48, 16, _f("avx512f"), "dpbf16_fma", 2),
    # Without a bf16/f16 dot unit, widening once while packing and running the f32 micro-kernel
    # beats widening pairs in the k loop (`dpbf16_fma`, 4x16: about half the f32 GEMM's rate).
    DotKernel("bf16_as_f32_avx2_6x16", "x86-64-v3", "bf16", 6, 16, 8, _f("avx2", "fma"),
              WIDEN_TO_F32, 1),
    DotKernel("f16_avx512_6x48", "x86-64-v4", "f16", 6, 48, 16, _f("avx512f"), "dpf16_fma", 2),
    DotKernel("f16_as_f32_avx2_6x16", "x86-64-v3", "f16", 6, 16, 8, _f("avx2", "fma", "f16c"),
              WIDEN_TO_F32, 1),
    DotKernel("u8s8_avx512vnni_8x48", "x86-64-v4", "u8s8", 8, 48, 16,
              _f("avx512f", "avx512bw", "avx512vnni"), "dpbusd", 4),
    DotKernel("u8s8_avx512bw_6x32", "x86-64-v4", "u8s8", 6, 32, 16, _f("avx512bw"),
              "dpbusd_pmaddwd", 4),
    # Codes widened to s16 while packing: one `vpmaddwd` + `vpaddd` per B vector in the k loop
    # (splitting byte quads there took about 9 vector ops per 32 multiply-adds, 3x16). 6x16:
    # 12 accumulators, 2 B vectors, an A broadcast and a product fill the 16 ymm registers.
    # Zen 1 issues ymm vpmaddwd at half its FMA rate, the same MAC ceiling as f32: 1024^3 ran
    # 1.19x the f32 GEMM there (3x16: ~0.9x); cores with two vpmaddwd ports allow twice f32.
    DotKernel("u8s8_s16_avx2_6x16", "x86-64-v3", "u8s8", 6, 16, 8, _f("avx2"), "pmaddwd", 2),
)


# A kernel dtype that may also run on another's kernels (after a conversion in packing).
_RUNS_ON = {"s8s8": ("u8s8",)}
DTYPES = ("bf16", "f16", "u8s8", "s8s8")


def _refusal(target: Target, entry: DotKernel) -> str | None:
    """Why `entry` cannot run on `target`, or None when it can."""
    reason = missing_features(target, entry)
    if reason is None and entry.is_amx and target.is_host() and not enable_amx():
        return "the OS refused this process AMX tile data (arch_prctl XCOMP_PERM)"
    return reason


def _logged_refusal(target: Target, entry: DotKernel) -> str | None:
    reason = _refusal(target, entry)
    if reason is not None and entry.is_amx and target.has(*entry.features):
        log.info("skipping %s: %s", entry.name, reason)
    return reason


def select_dot_kernel(target: Target, dtype: str) -> DotKernel:
    """The first entry along the target's family chain whose features the target has (for
    s8s8, a u8s8 entry when no s8s8 one applies)."""
    for kind in (dtype, *_RUNS_ON.get(dtype, ())):
        entry = select_entry(target, DOT_KERNELS, _logged_refusal, dtype=kind)
        if entry is not None:
            return entry
    raise UnsupportedError(
        f"no {dtype} GEMM micro-kernel for target {target.name} (family {target.family}); "
        "low-precision GEMMs need x86-64-v3 (AVX2) or newer — convert the operands to f32 "
        "and use tilefold.matmul")


def describe_lowp(target: Target) -> list[str]:
    """One line per kernel dtype: the micro-kernel chosen and why the faster ones were refused
    (for `tilefold info` / `explain`)."""
    lines = []
    for dtype in DTYPES:
        try:
            chosen = select_dot_kernel(target, dtype)
        except UnsupportedError as err:
            lines.append(f"{dtype}: none ({err})")
            continue
        line = f"{dtype}: {chosen.name}"
        if chosen.dtype != dtype:
            how = "s8 widened to s16, exact" if chosen.s16_codes else "A + 128, compensated"
            line += f" (as {chosen.dtype}: {how})"
        kinds = (dtype, *_RUNS_ON.get(dtype, ()))
        refused = [f"{e.name}: {why}" for e in DOT_KERNELS[:DOT_KERNELS.index(chosen)]
                   if e.dtype in kinds and (why := _refusal(target, e)) is not None]
        lines.append(line + (f"; refused {'; '.join(refused)}" if refused else ""))
    return lines
