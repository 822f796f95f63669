"""Which casts lose nothing: `holds(a, b)` when every value of dtype `a` is exactly one of `b`."""

from __future__ import annotations

from functools import cache

import numpy as np

from tilefold.dtypes import NUMPY_OWN, DType


@cache
def holds(a: DType, b: DType) -> bool:
    """True when casting `a` to `b` is exact, so `cast(cast(x: a, b), a)` is `x`."""
    if a == b or a.kind == "bool":
        return True  # false/true are 0/1 in every dtype
    if b.kind == "bool":
        return False
    if a.is_float:
        if not b.is_float:
            return False
        fa, fb = _finfo(a), _finfo(b)
        return (
            fb.nmant >= fa.nmant
            and fb.maxexp >= fa.maxexp
            and float(fb.smallest_subnormal) <= float(fa.smallest_subnormal)
            and (_has(b, np.inf) or not _has(a, np.inf))
            and (_has(b, np.nan) or not _has(a, np.nan))
        )
    ia = _iinfo(a)
    if b.is_integer:
        ib = _iinfo(b)
        return ib.min <= ia.min and ia.max <= ib.max
    fb = _finfo(b)
    return max(-int(ia.min), int(ia.max)) <= min(2 ** (fb.nmant + 1), float(fb.max))


def _finfo(dt: DType):
    """NumPy's finfo, or ml_dtypes' for the types it adds (imported only for those)."""
    if dt.storage in NUMPY_OWN:
        return np.finfo(dt.np_dtype)
    import ml_dtypes

    return ml_dtypes.finfo(dt.np_dtype)


def _iinfo(dt: DType):
    if dt.storage in NUMPY_OWN:
        return np.iinfo(dt.np_dtype)
    import ml_dtypes

    return ml_dtypes.iinfo(dt.np_dtype)


def _has(dt: DType, special: float) -> bool:
    """Whether `dt` can hold inf (or nan) at all (fp8e4m3 has no inf, fp4e2m1 neither)."""
    with np.errstate(all="ignore"):
        value = np.array(special).astype(dt.np_dtype).astype(np.float64)
    return bool(np.isnan(value)) if np.isnan(special) else bool(np.isinf(value))


def same_family(a: DType, b: DType) -> bool:
    """Both floats, or both integers/bools: the cast reference treats them alike as sources.

    A float source truncates and saturates into integers while an integer source wraps, so
    `cast(cast(x: i32, f64), i8)` is not `cast(x, i8)` even though i32 -> f64 is exact.
    """
    return a.is_float == b.is_float
