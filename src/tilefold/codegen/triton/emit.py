"""Kernel IR + GPU schedule -> the text of one `@triton.jit` function (and the helpers it calls).

The generated kernel takes the buffers' pointers, then every run-time size and stride
(`kernel_params`), then `n_rows`, `n_cols` and the constexprs `BLOCK_R`, `BLOCK_C` and
`ONE_PASS`. A program
owns BLOCK_R rows; every value is a tile of shape [BLOCK_R, 1] (varies by row only) or
[BLOCK_R, BLOCK_C] (by column too), or a scalar; loads and stores are masked at the tile's edge
and load a broadcast operand once per row (or once). Each distinct expression is one local,
so a value a pass needs twice is computed once; a reduction pass is a loop over column chunks
accumulating a whole tile, combined across the tile at the end. A kernel with reduction passes
has a second form, taken when `ONE_PASS` (the launch's chunk holds the whole row:
`GPUSchedule.launch`): no loops, every pass over the one chunk, sharing its loads and the
values computed from them; what a pass stores to the program's own tile, a later pass takes
from registers, as stored (no barrier, no second read), and of two stores to one tile only
the last is kept. A store of a value rounded to
the buffer's own dtype stores it unrounded: the conversion rounds to nearest even the same way.
"""

from __future__ import annotations

import math
import re

from tilefold.codegen.kernel import ir as kir
from tilefold.codegen.kernel.printer import print_kernel
from tilefold.codegen.triton.math import PRIMITIVE_FORMS, helpers_used
from tilefold.codegen.triton.schedule import GPUSchedule, row_body

IDENTITY = {"sum": "0.0", "max": "-_TF_INF", "min": "_TF_INF"}
COMBINE = {"sum": "_tf_add({0}, {1})", "max": "_tf_max({0}, {1})", "min": "_tf_min({0}, {1})"}
FINAL = {"sum": "tl.reduce({0}, 1, _tf_add, keep_dims=True)",
         "max": "tl.reduce({0}, 1, _tf_max, keep_dims=True)",
         "min": "tl.reduce({0}, 1, _tf_min, keep_dims=True)"}
POINTER_TYPES = {"f32": "*fp32", "bf16": "*bf16", "f16": "*fp16", "bool": "*i1"}
# a rounding primitive -> the buffer dtype whose store conversion rounds the same way
SAME_DTYPE_ROUNDING = {"round_bf16": "bf16", "round_f16": "f16"}


def ident(name: str) -> str:
    """A Python identifier for a kernel IR name."""
    return re.sub(r"\W", "_", name)


def kernel_params(kernel: kir.Kernel) -> tuple[tuple[str, ...], ...]:
    """The generated function's leading parameters: ("ptr", buffer), ("size", axis) for
    run-time sizes, ("stride", buffer, axis) for run-time strides."""
    ptrs = [("ptr", b.name) for b in kernel.buffers]
    sizes = [("size", a.name) for a in kernel.axes if a.size is None]
    strides = [("stride", b.name, a.name) for b in kernel.buffers
               for a, s in zip(kernel.axes, b.strides, strict=True) if s is None]
    return tuple(ptrs + sizes + strides)


def param_name(param: tuple[str, ...]) -> str:
    kind, *names = param
    return {"ptr": "{}_ptr", "size": "size_{}", "stride": "st_{}_{}"}[kind].format(
        *map(ident, names))


def signature(kernel: kir.Kernel) -> dict[str, str]:
    """Triton's type of every non-constexpr parameter (for `triton.compile` without a GPU)."""
    sig = {param_name(p): POINTER_TYPES[kernel.buffer(p[1]).dtype] if p[0] == "ptr" else "i32"
           for p in kernel_params(kernel)}
    return {**sig, "n_rows": "i32", "n_cols": "i32"}


class _Emitter(kir.StmtVisitor):
    def __init__(self, kernel: kir.Kernel, schedule: GPUSchedule):
        self.k, self.s = kernel, schedule
        self.lines: list[str] = []
        self.depth = 1
        self.memo: list[dict[kir.Expr, str]] = [{}]
        self.env: dict[str, str] = {}
        self.count = 0
        self.in_cols = False
        self.one_pass = False  # emitting the ONE_PASS form: passes over one chunk, no loops
        self.tile_stores: dict[str, int] = {}  # ONE_PASS: a buffer's last tile store's line
        self.loaded = {e.buffer for x in kernel_expressions(kernel) for e in kir.walk_expr(x)
                       if isinstance(e, kir.Load)}

    # --- text ---------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def local(self, text: str, prefix: str = "e") -> str:
        name = f"{prefix}{self.count}"
        self.count += 1
        self.line(f"{name} = {text}")
        return name

    def size(self, axis: str) -> str:
        n = self.k.axis(axis).size
        return str(n) if n is not None else f"size_{ident(axis)}"

    def stride(self, buf: str, axis: str) -> int | str:
        s = self.k.stride(buf, axis)
        return s if s is not None else f"st_{ident(buf)}_{ident(axis)}"

    # --- indices ------------------------------------------------------------------------
    def decompose(self, flat: str, axes: tuple[str, ...]) -> None:
        """Per-axis indices of a flat index over `axes` (row-major: the last fastest)."""
        rest = flat
        for i, axis in enumerate(reversed(axes)):
            if i == len(axes) - 1:
                self.line(f"ix_{ident(axis)} = {rest}")
            else:
                self.line(f"ix_{ident(axis)} = {rest} % {self.size(axis)}")
                rest = self.local(f"{rest} // {self.size(axis)}", "q")

    def offset(self, buf: str, axes: tuple[str, ...]) -> str | None:
        terms = []
        for axis in axes:
            s = self.stride(buf, axis)
            if s == 0:
                continue
            terms.append(f"ix_{ident(axis)}" if s == 1 else f"ix_{ident(axis)} * {s}")
        return " + ".join(terms) or None

    def varies(self, buf: str, axes: tuple[str, ...]) -> bool:
        return any(self.k.stride(buf, a) != 0 for a in axes)

    def columns(self, start: str | None) -> None:
        """Column indices and masks of the chunk starting at `start` (None: at 0)."""
        first = "" if start is None else f"tl.multiple_of({start}, BLOCK_C) + "
        self.line(f"cols = {first}tl.arange(0, BLOCK_C)[None, :].to(tl.int64)")
        self.line("col_mask = cols < n_cols")
        self.line("tile_mask = row_mask & col_mask")
        self.decompose("cols", self.s.col_axes)
        self.in_cols = True

    # --- memory -------------------------------------------------------------------------
    def address(self, buf: str) -> tuple[str, str | None]:
        """Pointer expression and mask for `buf` at the current tile (None: no mask)."""
        rows = self.varies(buf, self.s.row_axes)
        cols = self.in_cols and self.varies(buf, self.s.col_axes)
        parts = [f"roff_{ident(buf)}"] if rows else []
        col_off = self.offset(buf, self.s.col_axes) if cols else None
        if col_off is not None:
            parts.append(f"({col_off})")
        ptr = f"{ident(buf)}_ptr" + (f" + {' + '.join(parts)}" if parts else "")
        mask = {(True, True): "tile_mask", (True, False): "row_mask",
                (False, True): "col_mask"}.get((rows, cols))
        return ptr, mask

    def load(self, buf: str) -> str:
        ptr, mask = self.address(buf)
        text = f"tl.load({ptr})" if mask is None else f"tl.load({ptr}, mask={mask}, other=0)"
        if self.k.buffer(buf).dtype == "bool":
            return self.local(f"{text} != 0")
        return self.local(f"{text}.to(tl.float32)")

    def store(self, stmt: kir.Store) -> None:
        ptr, _ = self.address(stmt.buffer)
        zero, mask = ("zero_t", "tile_mask") if self.in_cols else ("zero_r", "row_mask")
        stored = stmt.value
        if isinstance(stored, kir.Call) and \
                SAME_DTYPE_ROUNDING.get(stored.op) == self.k.buffer(stmt.buffer).dtype:
            stored = stored.args[0]  # the store's own conversion rounds the same way
        value = self.expr(stored)
        if isinstance(stored, kir.Const):
            value = self.local(f"tl.full([1, 1], {value}, tl.float32)")
        elem = f"{ident(stmt.buffer)}_ptr.dtype.element_ty"
        self.line(f"tl.store({ptr} + {zero}, {value}.to({elem}), mask={mask})")
        dtype = self.k.buffer(stmt.buffer).dtype
        if self.one_pass and self.in_cols and dtype != "bool" and \
                self.varies(stmt.buffer, self.s.col_axes):
            # this program owns the tile: a later pass reads back what it stored, and a later
            # store there makes this one dead
            earlier = self.tile_stores.get(stmt.buffer)
            if earlier is not None:
                self.lines[earlier] = ""
            self.tile_stores[stmt.buffer] = len(self.lines) - 1
            memo = self.memo[-1]
            for e in [e for e in memo if any(isinstance(x, kir.Load) and x.buffer == stmt.buffer
                                             for x in kir.walk_expr(e))]:
                del memo[e]
            memo[kir.Load(stmt.buffer)] = value if dtype == "f32" else \
                self.local(f"{value}.to({elem}).to(tl.float32)")

    # --- expressions --------------------------------------------------------------------
    def expr(self, e: kir.Expr) -> str:
        if isinstance(e, kir.Const):
            return literal(e.value)
        if isinstance(e, kir.Ref):
            return self.env[e.name]
        for memo in reversed(self.memo):
            if e in memo:
                return memo[e]
        if isinstance(e, kir.Load):
            name = self.load(e.buffer)
        elif isinstance(e, kir.Dim):
            name = self.local(f"({self.size(e.axis)} + 0.0)")
        else:
            assert isinstance(e, kir.Call)
            name = self.local(PRIMITIVE_FORMS[e.op].format(*(self.expr(a) for a in e.args)))
        self.memo[-1][e] = name
        return name

    # --- statements ---------------------------------------------------------------------
    def on_loop(self, loop: kir.Loop) -> None:
        self.column_loop(loop)

    def on_store(self, stmt: kir.Store) -> None:
        self.store(stmt)

    def column_loop(self, loop: kir.Loop) -> None:
        if self.one_pass:
            self.column_pass(loop)
            return
        accs = {r.name: self.local(f"tl.full([BLOCK_R, BLOCK_C], {IDENTITY[r.op]}, tl.float32)",
                                   "acc") for r in loop.reductions}
        # a while loop: Triton 3.6's interpreter cannot range() over a run-time bound
        self.line("c0 = tl.program_id(0) * 0")  # a tensor even when n_cols is a constexpr 1
        self.line("while c0 < n_cols:")
        self.depth += 1
        self.memo.append({})
        self.columns("c0")
        self.stmts(loop.body)
        for red in loop.reductions:
            value = self.expr(red.value)
            masked = f"tl.where(tile_mask, {value}, {IDENTITY[red.op]})"
            self.line(f"{accs[red.name]} = " + COMBINE[red.op].format(accs[red.name], masked))
        self.line("c0 += BLOCK_C")
        self.memo.pop()
        self.depth -= 1
        self.in_cols = False
        stored = {st.buffer for st in loop.body if isinstance(st, kir.Store)}
        if stored & self.loaded:  # a later pass reads what this one wrote: make it visible
            self.line("tl.debug_barrier()")
        for red in loop.reductions:
            self.env[red.name] = self.finish(red, accs[red.name])

    def column_pass(self, loop: kir.Loop) -> None:
        """`loop` over the one chunk of the ONE_PASS form: the columns made by the first
        pass, loads and values shared with the other passes, and what a pass stores read
        back from registers (`store`)."""
        if not self.columns_made:
            self.columns(None)
            self.columns_made = True
        self.in_cols = True
        self.stmts(loop.body)
        totals = {}
        for red in loop.reductions:
            masked = f"tl.where(tile_mask, {self.expr(red.value)}, {IDENTITY[red.op]})"
            totals[red.name] = masked
        self.in_cols = False
        for red in loop.reductions:
            self.env[red.name] = self.finish(red, totals[red.name])

    def finish(self, red: kir.Reduction, acc: str) -> str:
        total = self.local(FINAL[red.op].format(acc), "t")
        if red.init is None:
            return total
        return self.local(COMBINE[red.op].format(total, literal(red.init)), "t")

    # --- the whole kernel ---------------------------------------------------------------
    def header(self) -> None:
        s = self.s
        self.line("pid = tl.program_id(0)")
        if s.loop_cols:
            self.line("pid_r = pid")
        else:
            self.line("n_col_blocks = (n_cols + BLOCK_C - 1) // BLOCK_C")
            self.line("pid_r = pid // n_col_blocks")
            self.line("pid_c = pid % n_col_blocks")
        self.line("rows = pid_r.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
        self.line("row_mask = rows < n_rows")
        self.decompose("rows", s.row_axes)
        for buf in self.k.buffers:
            off = self.offset(buf.name, s.row_axes)
            if off is not None:
                self.line(f"roff_{ident(buf.name)} = {off}")
        self.line("zero_r = tl.full([BLOCK_R, 1], 0, tl.int64)")
        self.line("zero_t = tl.full([BLOCK_R, BLOCK_C], 0, tl.int64)")
        if not s.loop_cols:
            self.columns("pid_c.to(tl.int64) * BLOCK_C")

    def function(self) -> list[str]:
        _, stmts = row_body(self.k)
        self.header()
        if self.s.loop_cols and any(isinstance(st, kir.Loop) for st in stmts):
            self.line("if ONE_PASS:  # the row is one chunk: every pass over it, loaded once")
            self.depth += 1
            self.one_pass, self.columns_made = True, False
            self.stmts(stmts)
            self.one_pass, self.memo, self.env = False, [{}], {}
            self.depth -= 1
            self.line("else:")
            self.depth += 1
            self.stmts(stmts)
            self.depth -= 1
        else:
            self.stmts(stmts)
        params = [param_name(p) for p in kernel_params(self.k)]
        head = ["@triton.jit",
                f"def {ident(self.k.name)}(",
                *(f"    {p}," for p in [*params, "n_rows", "n_cols"]),
                "    BLOCK_R: tl.constexpr,",
                "    BLOCK_C: tl.constexpr,",
                "    ONE_PASS: tl.constexpr,",
                "):"]
        return head + [line for line in self.lines if line]


def kernel_expressions(kernel: kir.Kernel) -> list[kir.Expr]:
    """Every expression the kernel's statements hold."""
    out, stack = [], list(kernel.body)
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, kir.Loop):
            stack.extend(stmt.body)
            out.extend(r.value for r in stmt.reductions)
        else:
            out.append(stmt.value)
    return out


def literal(value: float) -> str:
    """A float as Triton source (NaN and infinities as the module's constants)."""
    if math.isnan(value):
        return "_TF_NAN"
    if math.isinf(value):
        return "_TF_INF" if value > 0 else "(-_TF_INF)"
    return f"({value!r})" if value < 0 else repr(float(value))


def emit_triton(kernel: kir.Kernel, schedule: GPUSchedule) -> str:
    """The Python source of a module defining the kernel as a `@triton.jit` function named
    after it (the kernel IR and schedule in a comment above it)."""
    em = _Emitter(kernel, schedule)
    body = em.function()
    comment = [f"# {line}" for line in print_kernel(kernel).splitlines()]
    return triton_module(f"Triton kernel @{kernel.name}, generated by tilefold from its kernel IR.",
                         body, [*comment, f"# schedule: {schedule}"])


def triton_module(doc: str, body: list[str], notes: list[str]) -> str:
    """The Python source of a module of `@triton.jit` kernels `body`: its docstring, Triton's
    imports, the constants and the math helpers the kernels call, `notes` (comment lines)."""
    out = [f'"""{doc}"""', "import triton", "import triton.language as tl", "",
           '_TF_INF = tl.constexpr(float("inf"))', '_TF_NAN = tl.constexpr(float("nan"))', "",
           *(h + "\n" for h in helpers_used(body)), *notes, *body]
    return "\n".join(out) + "\n"


__all__ = ["emit_triton", "kernel_expressions", "kernel_params", "literal", "param_name",
           "signature", "triton_module"]
