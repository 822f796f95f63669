"""Fused attention kernels: scores, mask, online softmax and P·V in one pass over key blocks;
the backward recomputing the probabilities from each row's log-sum-exp."""

from tilefold.codegen.llvm.attention.kernel import (
    AttentionConfig,
    AttentionKernel,
    BackwardConfig,
    BackwardKernel,
    DecodeConfig,
    attention_kernel,
    backward_kernel,
)

__all__ = ["AttentionConfig", "AttentionKernel", "BackwardConfig", "BackwardKernel",
           "DecodeConfig", "attention_kernel", "backward_kernel"]
