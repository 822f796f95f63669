"""How large a tensor may be: sizes past 64-bit offsets or past the machine's memory are refused,
by name, before anything is allocated (instead of a MemoryError or, later, the OOM killer)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from tilefold.dtypes import DType
from tilefold.errors import ShapeError, TilefoldError
from tilefold.ir.core import Function, Operation
from tilefold.ir.types import TensorType

ADDRESS_LIMIT = 2**63 - 1
"""The largest size in bytes (and the largest dim) that 64-bit signed offsets can address."""

MEMORY_ENV = "TILEFOLD_MAX_BUFFER_BYTES"


def memory_limit() -> int:
    """Bytes one buffer may take: $TILEFOLD_MAX_BUFFER_BYTES, else the machine's memory."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if text:
        try:
            return int(text)
        except ValueError:
            raise TilefoldError(f"{MEMORY_ENV}={text!r} is not a number of bytes") from None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return ADDRESS_LIMIT


def format_bytes(n: int) -> str:
    """`n` bytes in the largest binary unit that keeps the number at least 1 (`1.5 TiB`)."""
    for power, unit in ((60, "EiB"), (50, "PiB"), (40, "TiB"), (30, "GiB"), (20, "MiB"),
                        (10, "KiB")):
        if n >= 1 << power:
            return f"{n / (1 << power):.3g} {unit}"
    return f"{n} bytes"


def size_problem(shape: Sequence[int], dtype: DType, limit: int | None = None) -> str | None:
    """Why an array of `shape` and `dtype` cannot exist within `limit` bytes (default: the
    memory limit), or None when it can."""
    if any(d > ADDRESS_LIMIT for d in shape):
        return f"dims above 2**63-1 cannot be addressed (got {max(shape)})"
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > ADDRESS_LIMIT:
        return f"it would take {nbytes:.3g} bytes, past what 64-bit offsets address"
    limit = memory_limit() if limit is None else limit
    if nbytes > limit:
        return (f"it would take {format_bytes(nbytes)}, more than one buffer may take here "
                f"({format_bytes(limit)}; ${MEMORY_ENV} sets that)")
    return None


def check_function(fn: Function, bindings: dict[str, int], source: str | None = None) -> None:
    """Raise a ShapeError at the first value of `fn` (an argument, or a result of any op,
    nested ones included) that is too large once `bindings` give its symbolic dims sizes.
    Values whose dims stay symbolic are skipped. `source` is the IR text, for a caret line."""
    limit = memory_limit()
    owners: list[tuple[Function | Operation, str, TensorType]] = [
        (fn, f"argument %{a.name}", a.type) for a in fn.args
    ]
    owners += [(op, f"%{r.name} ({op.name})", r.type) for op in fn.walk() for r in op.results]
    for owner, what, t in owners:
        bound = t.bind(bindings)
        if not bound.is_static:
            continue
        why = size_problem(bound.shape, t.dtype, limit)  # type: ignore[arg-type]
        if why is not None:
            shown = f"{t} = {bound}" if bound != t else str(t)
            raise ShapeError(f"{what} of type {shown} is too large: {why}; use smaller sizes",
                             owner.text_loc, source)
