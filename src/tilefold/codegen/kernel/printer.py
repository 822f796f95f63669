"""The kernel IR's text form: indented loops, infix arithmetic, buffers indexed by loop axes.

    kernel @softmax(i0 < ?, i1 < ?) {
      in  x: f32 strides [?, 1]
      out y: f32 strides [?, 1]
      for i0 {
        for i1 reduce(t0 = max(x[i0,i1]))
        for i1 reduce(t1 = sum(exp(x[i0,i1] - t0)))
        t2 = 1.0 / t1
        for i1 {
          y[i0,i1] = exp(x[i0,i1] - t0) * t2
        }
      }
    }
"""

from __future__ import annotations

from tilefold.codegen.kernel import ir as k

INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">",
         "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||"}


def _size(size: int | None) -> str:
    return "?" if size is None else str(size)


def format_expr(expr: k.Expr, kernel: k.Kernel, nested: bool = False) -> str:
    if isinstance(expr, k.Load):
        buf = kernel.buffer(expr.buffer)
        index = [a.name for a, s in zip(kernel.axes, buf.strides, strict=True) if s != 0]
        return f"{expr.buffer}[{','.join(index)}]"
    if isinstance(expr, k.Const):
        return repr(expr.value)
    if isinstance(expr, k.Dim):
        return f"dim({expr.axis})"
    if isinstance(expr, k.Ref):
        return expr.name
    assert isinstance(expr, k.Call)
    if expr.op in INFIX:
        lhs, rhs = (format_expr(a, kernel, nested=True) for a in expr.args)
        text = f"{lhs} {INFIX[expr.op]} {rhs}"
        return f"({text})" if nested else text
    return f"{expr.op}({', '.join(format_expr(a, kernel) for a in expr.args)})"


def _reduction(red: k.Reduction, kernel: k.Kernel) -> str:
    init = "" if red.init is None else f", init={red.init!r}"
    return f"{red.name} = {red.op}({format_expr(red.value, kernel)}{init})"


def _stmts(stmts: tuple[k.Stmt, ...], kernel: k.Kernel, indent: str, out: list[str]) -> None:
    for stmt in stmts:
        if isinstance(stmt, k.Loop):
            head = f"{indent}for {', '.join(stmt.axes) or '()'}"
            if stmt.reductions:
                head += f" reduce({', '.join(_reduction(r, kernel) for r in stmt.reductions)})"
            if not stmt.body:
                out.append(head)
                continue
            out.append(head + " {")
            _stmts(stmt.body, kernel, indent + "  ", out)
            out.append(indent + "}")
        elif isinstance(stmt, k.Let):
            out.append(f"{indent}{stmt.name} = {format_expr(stmt.value, kernel)}")
        else:
            target = format_expr(k.Load(stmt.buffer), kernel)
            out.append(f"{indent}{target} = {format_expr(stmt.value, kernel)}")


def print_kernel(kernel: k.Kernel, schedule: object | None = None) -> str:
    """The kernel as text; with a schedule, a trailing `schedule ...` line describes it."""
    axes = ", ".join(f"{a.name} < {_size(a.size)}" for a in kernel.axes)
    out = [f"kernel @{kernel.name}({axes}) {{"]
    for buf in kernel.buffers:
        role = "out" if buf.output else "tmp" if buf.scratch else "in "
        strides = ", ".join(_size(s) for s in buf.strides)
        out.append(f"  {role} {buf.name}: {buf.dtype} strides [{strides}]")
    _stmts(kernel.body, kernel, "  ", out)
    out.append("}")
    if schedule is not None:
        out.append(f"schedule {schedule}")
    return "\n".join(out)
