"""How a kernel runs on a GPU: which axes become rows and tile columns, tile size and warps.

A program owns `BLOCK_R` rows (the row axes flattened, last fastest) and works on tiles of
`BLOCK_R x BLOCK_C`. When the kernel reduces, the columns are its reduced axes (flattened) and
each reduction pass loops over them in chunks of `BLOCK_C`; otherwise the columns are the axis
along which most buffers are contiguous, and the grid also splits them. The tile sizes are
picked per launch from the actual sizes (`launch`), within the schedule's bounds.

A reduction whose whole row fits ONE_PASS_COLS columns runs in one pass (`one_pass`): one
chunk the width of the row, held in registers by up to MAX_WARPS warps, so every pass of the
kernel reads the row loaded once (softmax: x read once, each e^(x - max) computed once).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilefold.codegen.kernel.ir import Kernel, Loop
from tilefold.errors import UnsupportedError
from tilefold.target.gpu import GPUTarget

ELEMENTS_PER_THREAD = 16  # four 128-bit loads of f32 per thread per tile
NUM_WARPS = 4
MIN_COLS = 16  # columns of a rows-first tile, at least
MAX_WARPS = 16
ONE_PASS_COLS = ELEMENTS_PER_THREAD * MAX_WARPS * 32  # a row held in registers, at most


@dataclass(frozen=True)
class Launch:
    """One launch's tile (BLOCK_R x BLOCK_C), warps, and whether the row is one chunk."""

    block_r: int
    block_c: int
    num_warps: int
    one_pass: bool


@dataclass(frozen=True)
class GPUSchedule:
    """`row_axes` are flattened over programs; `col_axes` form a tile's columns, looped
    within a program when `loop_cols` (reductions), split over programs otherwise. A tile
    holds at most `tile_elements`, a row chunk at most `max_block_cols`."""

    row_axes: tuple[str, ...]
    col_axes: tuple[str, ...]
    loop_cols: bool
    tile_elements: int
    max_block_cols: int
    num_warps: int
    rows_first: bool = False  # memory is contiguous along rows, not columns (column sums)
    one_pass_cols: int = ONE_PASS_COLS  # the longest row a reduction holds in one chunk

    def block_shape(self, n_rows: int | None, n_cols: int | None) -> tuple[int, int]:
        """(BLOCK_R, BLOCK_C), powers of two: columns first (up to the row's length), then as
        many rows as fill the tile; `rows_first` the other way round (up to MIN_COLS
        columns), so neighbouring lanes read neighbouring addresses. None sizes (unknown)
        take the bounds."""
        if self.rows_first:
            most = self.tile_elements // MIN_COLS
            rows = most if n_rows is None else min(_pow2(n_rows), most)
            cols = self.tile_elements // rows
            return rows, cols if n_cols is None else min(cols, _pow2(n_cols))
        cols = self.max_block_cols if n_cols is None else min(_pow2(n_cols), self.max_block_cols)
        rows = max(1, self.tile_elements // cols)
        if n_rows is not None:
            rows = min(rows, _pow2(n_rows))
        return rows, cols

    def launch(self, n_rows: int | None, n_cols: int | None) -> Launch:
        """The tile, warps and pass form for these sizes: a reduction whose row fits
        `one_pass_cols` takes it whole in one chunk, with warps enough for ELEMENTS_PER_THREAD
        elements a thread; anything else `block_shape` and the schedule's warps."""
        if self.loop_cols and n_cols is not None and 0 < n_cols <= self.one_pass_cols:
            cols = _pow2(n_cols)
            rows = max(1, self.tile_elements // cols)
            if n_rows is not None:
                rows = min(rows, _pow2(n_rows))
            warps = min(MAX_WARPS, max(self.num_warps,
                                       rows * cols // (ELEMENTS_PER_THREAD * 32)))
            return Launch(rows, cols, warps, True)
        return Launch(*self.block_shape(n_rows, n_cols), self.num_warps, False)

    def __str__(self) -> str:
        how = ("looped" if self.loop_cols else "split") + (", rows first" if self.rows_first
                                                            else "")
        return (f"rows ({', '.join(self.row_axes)}) x cols ({', '.join(self.col_axes)}) {how}, "
                f"tile <= {self.tile_elements}, chunk <= {self.max_block_cols}, "
                f"{self.num_warps} warps")


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def row_body(kernel: Kernel) -> tuple[tuple[str, ...], tuple]:
    """The outer axes and the statements run once per row: a lone top-level loop without
    reductions is the loop over rows; any other body runs once (no outer axes)."""
    body = kernel.body
    if len(body) == 1 and isinstance(body[0], Loop) and not body[0].reductions:
        return body[0].axes, body[0].body
    return (), body


def shape_problem(kernel: Kernel) -> str | None:
    """Why the kernel's loop nest is not rows of column passes (None when it is)."""
    _, stmts = row_body(kernel)
    inner = [s for s in stmts if isinstance(s, Loop)]
    if len({s.axes for s in inner}) > 1:
        return "its passes loop over different axes"
    if any(isinstance(t, Loop) for s in inner for t in s.body):
        return "it nests loops three deep"
    return None


def choose_gpu_schedule(kernel: Kernel, target: GPUTarget) -> GPUSchedule:
    """Columns: the reduced axes, else the outer axis most buffers walk with stride 1 (ties to
    the later axis). Tiles of ELEMENTS_PER_THREAD elements per thread of NUM_WARPS warps; a
    reduction chunk of a whole tile (so rows up to that length take one pass each). Rows come
    first in a tile when some buffer is contiguous along the last row axis and none along the
    columns (a sum over a leading axis)."""
    problem = shape_problem(kernel)
    if problem is not None:
        raise UnsupportedError(f"kernel @{kernel.name}: no GPU schedule: {problem}")
    outer, stmts = row_body(kernel)
    inner = next((s.axes for s in stmts if isinstance(s, Loop)), ())
    tile = ELEMENTS_PER_THREAD * NUM_WARPS * target.warp_size
    if inner:
        cols, loop = inner, True
    elif outer:
        def score(axis: str) -> tuple[int, int]:
            unit = sum(kernel.stride(b.name, axis) == 1 for b in kernel.buffers)
            return unit, outer.index(axis)
        cols, loop = (max(outer, key=score),), False
    else:
        cols, loop = (), False
    rows = tuple(a for a in outer if a not in cols)

    def unit(axes: tuple[str, ...]) -> bool:
        return any(kernel.stride(b.name, a) == 1 for b in kernel.buffers for a in axes)

    rows_first = bool(rows) and unit(rows[-1:]) and not unit(cols)
    return GPUSchedule(rows, cols, loop, tile, tile, NUM_WARPS, rows_first)
