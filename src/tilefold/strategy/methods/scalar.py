"""Hand-written scalar loops (`codegen/cpu/scalar.py`) for small elementwise groups that compute
on integers: a model's index arithmetic, which the vectorized kernel IR (f32 math) leaves to
NumPy. Native, they replay with the rest of a decode step."""

from __future__ import annotations

import math

from tilefold.codegen.cpu.scalar import Node, ScalarGroup, refusal, scalar_kernel
from tilefold.ir.shapes import broadcast_shapes
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem

ELEMENT_S = 1.5e-9  # per element and op: a scalar loop with an index split per element
MAX_ELEMENTS = 1 << 16  # beyond this NumPy's vector loops win


@register_method
class ScalarLoop(Method):
    name = "handwritten.scalar"
    family = "hand-written"
    generators = ("tilefold.codegen.cpu.scalar",)

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        values = [*problem.inputs, *(r for op in problem.body for r in op.results)]
        if not any(problem.types[v].dtype.is_integer for v in values):
            return "no integer values (float groups are the kernel IR's)"
        for op in problem.body:
            why = refusal(op.name, [str(problem.types[v].dtype) for v in op.operands],
                          str(problem.types[op.results[0]].dtype))
            if why is not None:
                return why
        shapes = {problem.shape(v) for v in problem.outputs}
        if len(shapes) != 1:
            return "outputs of different shapes (an elementwise group writes one shape)"
        (shape,) = shapes
        whole = broadcast_shapes("scalar loop", *(problem.shape(v) for v in values))
        if tuple(whole) != shape:
            return "an operand is larger than the outputs (not elementwise)"
        elements = math.prod(shape)
        if elements > MAX_ELEMENTS:
            return f"{elements} elements (scalar loops are for index arithmetic, <= {MAX_ELEMENTS})"
        estimate = ELEMENT_S * max(elements, 1) * len(problem.body) + ctx.machine.call_s
        return [self.candidate({}, estimate, lambda: build(problem, ctx), "one scalar loop")]


def _strides(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous `shape` broadcast to `out` (0 where broadcast)."""
    strides, step = [], 1
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    for n in reversed(padded):
        strides.append(step if n != 1 else 0)
        step *= n
    return tuple(reversed(strides))


def build(problem: Problem, ctx: Context) -> Kernel:
    shape = problem.shape(problem.outputs[0])
    index = {v: i for i, v in enumerate(problem.inputs)}
    nodes = []
    for op in problem.body:
        index[op.results[0]] = len(index)
        nodes.append(Node(op.name, tuple(index[v] for v in op.operands),
                          str(problem.types[op.results[0]].dtype)))
    group = ScalarGroup(tuple(shape),
                        tuple((str(problem.types[v].dtype), _strides(problem.shape(v), shape))
                              for v in problem.inputs),
                        tuple(nodes), tuple(index[v] for v in problem.outputs))
    return Kernel.native(scalar_kernel(group, problem.kernel_symbol("tf_scalar"), ctx.target))
