"""Hand-built LLVM kernels for CPUs that kernel methods call: the row-kernel calling convention,
the expert row softmax, and the LTO library with the row kernels that call it."""
