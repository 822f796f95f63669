"""How far a tilefold result may sit from its float64 oracle: one rule for every test.

Elementwise math is within 5 ulp (vecmath.ULP_BOUNDS) plus a few roundings; a sum of n terms
adds f32's summation error, about sqrt(n) ulp of the sum of magnitudes with independent
accumulators (blocked or vector sums, FMA), bounded here by n ulp so a test never flakes while
a lost, doubled or misplaced term (an error of the size of a term) stays far outside.
bf16/f16 results are within a rounding or two of their format.
"""

from __future__ import annotations

F32_ULP = 2.0**-24
LOW_PRECISION_ULP = {"bf16": 2.0**-8, "f16": 2.0**-11}


def tolerance(dtype: str = "f32", reduced: int = 1, scale: float = 1.0) -> dict[str, float]:
    """`rtol`/`atol` for `np.testing.assert_allclose` of a `dtype` result built from sums of
    `reduced` terms (a GEMM's K, plus a row's length when an epilogue reduces the row) whose
    magnitudes are about `scale` (atol grows with it: cancellation leaves absolute error)."""
    if dtype in LOW_PRECISION_ULP:
        eps = 2 * LOW_PRECISION_ULP[dtype]
    else:
        eps = F32_ULP * (16 + 4 * reduced)
    return {"rtol": eps, "atol": eps * max(1.0, scale)}
