"""Generated native kernels: the row-kernel calling convention, row programs, expert kernels."""
