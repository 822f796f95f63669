"""Generated native kernels: the row-kernel calling convention and expert kernels."""
