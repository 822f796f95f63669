"""Hand-written scalar loops (`codegen/llvm/cpu/scalar.py`) for small elementwise groups that
compute on integers: a model's index arithmetic, which the vectorized kernel IR (f32 math) leaves to
NumPy. Native, they replay with the rest of a decode step."""

from __future__ import annotations

import math

from tilefold.codegen.llvm.cpu.scalar import Node, ScalarGroup, refusal, scalar_kernel
from tilefold.ir.shapes import broadcast_shapes
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem

ELEMENT_S = 1.5e-9  # per element and op: a scalar loop with an index split per element


@register_method
class ScalarLoop(Method):
    name = "handwritten.scalar"
    family = "hand-written"
    generators = ("tilefold.codegen.llvm.cpu.scalar",)

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        read = _read_inputs(problem)
        values = [*read, *(r for op in problem.body for r in op.results)]
        if not any(problem.types[v].dtype.is_integer for v in values) and \
                problem.first("arange") is None:
            return "no integer values or arange (float groups are the kernel IR's)"
        for op in problem.body:
            why = refusal(op.name, [str(problem.types[v].dtype) for v in op.operands
                                    if op.name != "dim_size"],
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
        elements = math.prod(shape)  # large ones: NumPy's vector loops win, by the estimates
        estimate = ELEMENT_S * max(elements, 1) * len(problem.body) + ctx.machine.call_s
        return [self.candidate({}, estimate, lambda: build(problem, ctx), "one scalar loop")]


def element_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous `shape` broadcast to `out` (0 where broadcast)."""
    strides, step = [], 1
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    for n in reversed(padded):
        strides.append(step if n != 1 else 0)
        step *= n
    return tuple(reversed(strides))


def _read_inputs(problem: Problem) -> list:
    """The inputs whose elements the loop reads (not those only `dim_size` looks at)."""
    used = {v for op in problem.body if op.name != "dim_size" for v in op.operands}
    return [v for v in problem.inputs if v in used]


def build(problem: Problem, ctx: Context) -> Kernel:
    shape = problem.shape(problem.outputs[0])
    read = set(_read_inputs(problem))
    index = {v: i for i, v in enumerate(problem.inputs)}
    nodes = []
    for op in problem.body:
        index[op.results[0]] = len(index)
        attrs = problem.attrs(op)
        dtype = str(problem.types[op.results[0]].dtype)
        if op.name == "dim_size":  # a size this plan knows: a constant of the loop
            size = problem.shape(op.operands[0])[attrs["axis"]]
            nodes.append(Node("arange", (), dtype, start_step=(float(size), 0.0)))
            continue
        nodes.append(Node(op.name, tuple(index[v] for v in op.operands), dtype,
                          start_step=(float(attrs.get("start", 0.0)),
                                      float(attrs.get("step", 1.0)))))
    group = ScalarGroup(tuple(shape),
                        tuple((str(problem.types[v].dtype) if v in read else "",
                               element_strides(problem.shape(v), shape)) for v in problem.inputs),
                        tuple(nodes), tuple(index[v] for v in problem.outputs))
    return Kernel.native(scalar_kernel(group, "tf_scalar", ctx.target))
