"""Launch configs of the Triton attention template and the few a GPU target and shape make
worth trying.

`propose_attention_configs` takes query and key blocks that suit the matrix units (powers of
two of at least 16, not far past the sequence lengths), keeps those whose pipelined K and V
blocks and the Q block (in the dot's dtype) fit the target's shared memory per block, and
orders them by waves of programs over the SMs times each program's work (its key steps'
products with the query rows padded to a warpgroup's 64, or their loads when a block is too
thin to hide them, as the GEMM's model charges), larger blocks first on a tie. Measuring them
is the GPU tuner's job.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tilefold.codegen.triton.attention import head_tile
from tilefold.codegen.triton.gemm_config import ELEMENT_BYTES, LOAD_COST
from tilefold.errors import UnsupportedError
from tilefold.target.gpu import GPUTarget

BLOCKS = ((128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (64, 32), (32, 32), (16, 32),
          (16, 16))
STAGES = (3, 2)


@dataclass(frozen=True)
class AttentionConfig:
    """One launch of `TritonAttention`: query rows and keys a program takes per step, warps
    and the key loop's pipeline stages."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            size = getattr(self, name)
            if size < 16 or size & (size - 1):
                raise UnsupportedError(f"AttentionConfig: {name} = {size}; Triton's dot takes "
                                       "blocks of a power of two >= 16")
        if self.num_warps < 1 or self.num_stages < 1:
            raise UnsupportedError("AttentionConfig: num_warps and num_stages must be >= 1")

    def launch(self) -> dict[str, int]:
        """The keyword arguments `TritonAttention.__call__` takes."""
        return asdict(self)

    def shared_bytes(self, d: int, dtype: str) -> int:
        """Shared memory of the Q block and `num_stages` K and V blocks."""
        size = ELEMENT_BYTES[dtype]
        return (self.block_m + 2 * self.num_stages * self.block_n) * head_tile(d) * size


def _near(size: int, block: int) -> bool:
    return block <= max(16, 1 << max(0, (size - 1).bit_length()))


def propose_attention_configs(target: GPUTarget, heads: int, sq: int, sk: int, d: int,
                              dtype: str, limit: int = 4) -> list[AttentionConfig]:
    """Up to `limit` configs for `heads` (batch x query heads) of `sq` queries over `sk` keys of
    head dim `d` in `dtype`, best guess first, each within `target`'s shared memory."""
    if min(heads, sq, sk, d) < 1:
        raise UnsupportedError(f"propose_attention_configs: heads, Sq, Sk, D = {heads}, {sq}, "
                               f"{sk}, {d}; every size must be >= 1")
    if dtype not in ("f32", "f16", "bf16"):
        raise UnsupportedError(f"propose_attention_configs: the attention template takes "
                               f"f32/f16/bf16, not {dtype}")
    scored = []
    for bm, bn in BLOCKS:
        if not (_near(sq, bm) and _near(sk, bn)):
            continue
        warps = 8 if bm >= 128 and max(bn, head_tile(d)) >= 128 else 4  # 4 would spill
        config = next((c for c in (AttentionConfig(bm, bn, warps, s) for s in STAGES)
                       if c.shared_bytes(d, dtype) <= target.shared_memory_per_block), None)
        if config is None:
            continue
        programs = heads * -(-sq // bm)
        waves = math.ceil(programs / (target.sm_count or programs))
        # a key step's products, with the query rows padded to a warpgroup's 64, or its loads
        # (the Q block once, K and V blocks each step) when the block is too thin to hide them
        step = max(max(bm, 64) * bn, LOAD_COST * (bm + 2 * bn))
        scored.append((waves * -(-sk // bn) * step, -bm, -bn, config))
    if not scored:
        raise UnsupportedError(f"propose_attention_configs: no block of {dtype} with head dim "
                               f"{d} fits {target.name}'s {target.shared_memory_per_block} bytes "
                               "of shared memory")
    scored.sort(key=lambda s: s[:3])
    return [s[3] for s in scored[:limit]]


__all__ = ["AttentionConfig", "propose_attention_configs"]
