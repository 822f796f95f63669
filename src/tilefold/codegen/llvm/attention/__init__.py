"""Fused attention kernels: scores, mask, online softmax and P·V in one pass over key blocks."""

from tilefold.codegen.llvm.attention.kernel import (
    AttentionConfig,
    AttentionKernel,
    DecodeConfig,
    attention_kernel,
)

__all__ = ["AttentionConfig", "AttentionKernel", "DecodeConfig", "attention_kernel"]
