"""Tile configs of the Triton GEMM template and the few a GPU target and shape make worth trying.

`propose_configs` starts from tiles that suit the matrix units (multiples of 16, K steps of
32 or more bytes' worth of elements), drops those far larger than the problem, gives each the
deepest software pipeline whose shared memory (`num_stages` copies of an A and a B tile, in
the dtype the dot reads) fits the target's per-block limit (227 KB on sm_90), and adds split-K
when too few output tiles would leave most SMs idle while K is long. Configs are ordered by a
rough estimate (waves of tiles over the SMs, a thin tile costing its loads, then tile
size); measuring them is the tuner's job.

On sm_90 and later, when the caller says the operands suit the tensor memory accelerator
(`tma=True`: see `gemm_launch.tma_order`), the first config is followed by its persistent
twin: one program an SM looping over the tiles, A and B tiles copied by TMA through tensor
descriptors, with fewer stages where C's tile (in the output's dtype) must fit beside them.
It comes second, not first, because nothing here can tell the two apart without measuring;
the tuner times both (and checks each against its reference first).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tilefold.errors import UnsupportedError
from tilefold.target.gpu import GPUTarget

# bytes per element of the operands the dot reads from shared memory
ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "fp8e4m3": 1}
# (BLOCK_M, BLOCK_N, BLOCK_K)
TILES = ((128, 256, 128), (128, 256, 64), (256, 128, 128), (256, 128, 64), (128, 128, 128),
         (128, 128, 64), (128, 64, 64), (64, 128, 128), (64, 128, 64), (64, 64, 64),
         (64, 64, 32), (32, 64, 64), (32, 32, 32), (16, 64, 128), (16, 32, 64), (16, 16, 32))
# tiles for 1-byte dtypes only: a K step of 128 fp8 is one 128-byte swizzle row of shared
# memory, as a 64-element bf16 step is
BYTE_TILES = frozenset({(128, 256, 128), (256, 128, 128), (128, 128, 128), (64, 128, 128)})
MAX_STAGES = 5
MAX_SPLIT_K = 16
TMA_CAPABILITY = (9, 0)  # Hopper: the first NVIDIA architecture with tensor descriptors
TMA_DTYPES = ("f16", "bf16", "fp8e4m3")  # the matrix units' dtypes the persistent twin serves
# A persistent tile's epilogue converts the accumulator's layout through shared memory in C's
# dtype (BLOCK_M x BLOCK_N elements), while the next tile's copies fill the pipeline, so that
# scratch comes on top of the stages; plus the pipeline's barriers and alignment
EPILOGUE_SLACK = 1024
LOAD_COST = 64  # products a tile must do per element it loads to keep the matrix units busy
# f32 accumulator registers a thread may hold (of 255): a precise fp8 dot keeps a second,
# partial accumulator beside the first (see `gemm.dot_options`)
ACC_REGISTERS = 128


@dataclass(frozen=True)
class GemmConfig:
    """One launch config: the output tile (BLOCK_M x BLOCK_N), the K step, how many row blocks
    share B's columns in L2 (GROUP_M), warps, pipeline stages and the K split.

    `persistent` > 0 asks for the persistent TMA variant of the template with at most that
    many programs (the SM count), each looping over output tiles; 0 is one program a tile."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    persistent: int = 0

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            size = getattr(self, name)
            if size < 16 or size & (size - 1):
                raise UnsupportedError(f"GemmConfig: {name} = {size}; Triton's dot takes tiles "
                                       "of a power of two >= 16")
        if self.group_m < 1 or self.split_k < 1 or self.num_stages < 1:
            raise UnsupportedError(f"GemmConfig: group_m, split_k and num_stages must be >= 1, "
                                   f"got {self.group_m}, {self.split_k}, {self.num_stages}")
        if self.persistent < 0 or (self.persistent and self.split_k > 1):
            raise UnsupportedError(f"GemmConfig: persistent = {self.persistent} with split_k = "
                                   f"{self.split_k}; the persistent variant takes programs >= 1 "
                                   "and no K split (split K for few tiles, persist for many)")

    def shared_bytes(self, dtype: str) -> int:
        """Shared memory the pipelined A and B tiles take when the dot reads `dtype`."""
        size = _element_bytes(dtype)
        return self.num_stages * (self.block_m + self.block_n) * self.block_k * size

    def epilogue_bytes(self, out_dtype: str) -> int:
        """Shared memory a persistent config's epilogue keeps beside the pipeline: the tile
        in C's dtype (its layout conversion) and the barriers (0 for one program a tile)."""
        if not self.persistent:
            return 0
        return self.block_m * self.block_n * _element_bytes(out_dtype) + EPILOGUE_SLACK

    def grid(self, m: int, n: int, batch: int = 1) -> tuple[int, int, int]:
        """Programs along (output tiles, batch, K splits); a persistent config's programs
        share out all tiles of every batch entry along axis 0."""
        tiles = -(-m // self.block_m) * -(-n // self.block_n)
        if self.persistent:
            return (min(self.persistent, tiles * batch), 1, 1)
        return (tiles, batch, self.split_k)


def _element_bytes(dtype: str) -> int:
    if dtype not in ELEMENT_BYTES:
        raise UnsupportedError(f"the Triton GEMM's dot reads {', '.join(ELEMENT_BYTES)}, "
                               f"not {dtype}")
    return ELEMENT_BYTES[dtype]


def _fits(size: int, block: int, floor: int = 16) -> bool:
    """Whether a tile dimension is not far beyond the problem's: at most the power of two at
    or above it, or `floor` (16 rows or columns for the matrix units, a 32-element K step)."""
    return block <= max(floor, 1 << max(0, (size - 1).bit_length()))


def _split(target: GPUTarget, tiles: int, k: int, block_k: int) -> int:
    """K splits that fill the SMs when the output has too few tiles, each split keeping at
    least four K steps of work."""
    if target.sm_count is None or tiles >= target.sm_count:
        return 1
    split = 1
    while (split * 2 <= MAX_SPLIT_K and tiles * split * 2 <= target.sm_count
           and k // (split * 2) >= 4 * block_k):
        split *= 2
    return split


def persistent_ok(target: GPUTarget, dtype: str) -> bool:
    """Whether `target` runs the persistent TMA variant for a dot reading `dtype`: an NVIDIA
    chip of sm_90 or later whose SM count is known (the grid is one program an SM)."""
    return (target.vendor == "nvidia" and target.compute_capability is not None
            and target.compute_capability >= TMA_CAPABILITY and target.sm_count is not None
            and dtype in TMA_DTYPES)


def _persistent_twin(target: GPUTarget, config: GemmConfig, dtype: str, out_dtype: str
                     ) -> GemmConfig | None:
    """`config` as the persistent variant, its pipeline cut to leave the epilogue's scratch
    for C in `out_dtype` free (None when fewer than two stages would remain)."""
    twin = dataclasses.replace(config, persistent=target.sm_count)
    per_stage = config.shared_bytes(dtype) // config.num_stages
    stages = min(config.num_stages, (target.shared_memory_per_block
                                     - twin.epilogue_bytes(out_dtype)) // per_stage)
    if stages < 2:
        return None
    return dataclasses.replace(twin, num_stages=stages)


def propose_configs(target: GPUTarget, m: int, n: int, k: int, dtype: str,
                    limit: int = 4, tma: bool = False, out_dtype: str = "f32",
                    fp8_fast_accum: bool = False) -> list[GemmConfig]:
    """Up to `limit` configs for an M x N x K GEMM whose dot reads `dtype`, best guess first,
    each within `target`'s shared memory per block; with `tma` (the operands suit tensor
    descriptors) on a target where `persistent_ok`, one more: the first's persistent twin,
    second, its stages leaving room for C's tile in `out_dtype` (the widest output; f32 when
    unknown, which always fits). An fp8 dot accumulating precisely (not `fp8_fast_accum`)
    holds two accumulators, so it takes only tiles whose two fit ACC_REGISTERS a thread; an
    f32 dot is budgeted the same (its operand fragments take the other half)."""
    if min(m, n, k) < 1:
        raise UnsupportedError(f"propose_configs: M, N, K = {m}, {n}, {k}; every size must be "
                               ">= 1 (an empty GEMM launches nothing)")
    size = _element_bytes(dtype)
    if dtype != "f32" and not target.has_matrix(dtype):  # f32 runs IEEE products, no TF32
        raise UnsupportedError(f"propose_configs: {target.name}'s matrix units take "
                               f"{', '.join(sorted(target.matrix_dtypes))}, not {dtype}")
    scored = []
    for bm, bn, bk in TILES:
        if bk * size < 32 or (size != 1 and (bm, bn, bk) in BYTE_TILES) or \
                not (_fits(m, bm) and _fits(n, bn) and _fits(k, bk, 32)):
            continue
        per_stage = (bm + bn) * bk * size
        stages = min(MAX_STAGES, target.shared_memory_per_block // per_stage)
        if stages < 2:
            continue
        tiles = -(-m // bm) * -(-n // bn)
        split = _split(target, tiles, k, bk)
        warps = 8 if bm * bn >= 128 * 128 else 4
        # a precise fp8 dot holds a second accumulator; an f32 dot runs IEEE FMAs whose A and B
        # fragments sit in registers beside the tile (128 x 256 on 8 warps spilled 884 bytes)
        accumulators = 2 if (dtype == "fp8e4m3" and not fp8_fast_accum) or dtype == "f32" \
            else 1
        if bm * bn * accumulators > ACC_REGISTERS * warps * target.warp_size:
            continue
        config = GemmConfig(bm, bn, bk, 8, warps, stages, split)
        sms = target.sm_count or tiles
        waves = math.ceil(tiles * split / sms)
        # a wave takes one tile's time: its products, or its loads when the tile is too thin
        # to hide them (below 64 products an element loaded, as a 128 x 128 tile has)
        work = waves * max(bm * bn, LOAD_COST * (bm + bn)) * -(-k // split)
        scored.append((work, -bm * bn, config))
    if not scored:
        raise UnsupportedError(f"propose_configs: no tile of {dtype} for {m} x {n} x {k} fits "
                               f"{target.name}'s {target.shared_memory_per_block} bytes of "
                               "shared memory in two stages")
    scored.sort(key=lambda s: (s[0], s[1]))
    configs = [config for _, _, config in scored[:limit]]
    twin = _persistent_twin(target, configs[0], dtype, out_dtype) \
        if tma and configs[0].split_k == 1 and persistent_ok(target, dtype) else None
    return [configs[0], twin, *configs[1:]] if twin is not None else configs


__all__ = ["GemmConfig", "persistent_ok", "propose_configs"]
