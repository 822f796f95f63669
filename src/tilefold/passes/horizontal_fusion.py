"""horizontal-fusion: structurally identical elementwise regions over different tensors become
one `fused {members = K}` region, which one multi-tensor kernel runs (Inductor's foreach).

An optimizer step applies one update chain to every parameter: after vertical fusion that is
a region per parameter (and one per step counter), each its own kernel. Regions whose ops,
attributes, dtypes and wiring agree, whose every operand is either a function argument over
the region's whole space or a 0-d scalar, and none of which is computed from another, are
put side by side in one
region, member after member (arguments, ops, yields); its meaning is unchanged (the reference
interpreter runs it as it is), and the multi-tensor method (`strategy/methods/multitensor.py`)
runs it as one native kernel over a table of the members' pointers and lengths.
"""

from __future__ import annotations

from tilefold.ir import OPS, Block, Function, Operation, Value
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.fusion import _schedule
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter

# what the memory-bound kernels load, compute (in f32) and store: integer index arithmetic
# stays with its own methods (the scalar loops)
KERNEL_DTYPES = frozenset({"f32", "bf16", "f16", "bool"})


def signature(op: Operation) -> tuple | None:
    """What must agree for `fused` regions to share a kernel (None: `op` cannot): each region
    op's name, attributes, result dtypes and operands (a region argument by position, an
    earlier op's result by position); each argument's dtype and whether it is the region's
    whole space or a 0-d scalar. Shapes beyond that do not enter: the kernel runs any length.
    Only regions of the kernels' dtypes (`KERNEL_DTYPES`) qualify, and only where every
    operand of the whole space is an argument of the function (the tensors a step is handed,
    C-contiguous: a kernel's result may be a strided view, which the multi-tensor kernel
    would have copied)."""
    if op.name != "fused" or op.attr("kind") != "memory" or op.attr("members") != 1:
        return None
    (region,) = op.regions
    space = tuple(op.results[0].type.shape)
    if any(tuple(r.type.shape) != space for r in op.results):
        return None
    values = [*region.args, *(r for inner in region.ops for r in inner.results)]
    if any(v.type.dtype.name not in KERNEL_DTYPES for v in values):
        return None
    local: dict[Value, tuple] = {}
    args = []
    for i, (a, outer) in enumerate(zip(region.args, op.operands, strict=True)):
        shape = tuple(a.type.shape)
        if shape not in (space, ()) or (shape and outer.defining_op is not None):
            return None
        local[a] = ("arg", i)
        args.append((a.type.dtype.name, shape == ()))
    body = []
    for j, inner in enumerate(region.ops[:-1]):
        if not inner.has_trait("elementwise") or inner.regions:
            return None
        for k, r in enumerate(inner.results):
            local[r] = ("op", j, k)
        attrs = tuple(sorted((k, repr(v)) for k, v in inner.attrs.items()))
        body.append((inner.name, attrs, tuple(local[v] for v in inner.operands),
                     tuple(r.type.dtype.name for r in inner.results)))
    yields = tuple(local[v] for v in region.terminator.operands)
    return tuple(args), tuple(body), yields


@register_pass
class HorizontalFusion(Pass):
    """Put structurally identical elementwise `fused` regions side by side in one region."""

    options = (Option("min-members", int, 2, "fewest regions worth one multi-tensor kernel"),
               Option("max-members", int, 1024, "most regions in one"),)
    statistics = (Statistic("num-horizontal", "multi-tensor regions created"),
                  Statistic("num-members", "regions put into them"))

    def run_on_function(self, fn: Function) -> None:
        buckets: dict[tuple, list[list[Operation]]] = {}
        # a member's result -> its bucket. Once an op that joins no bucket reads one, the
        # bucket takes no more members: merged at its last member, the region would make
        # that reader wait behind every member while the ops independent of it ran first (a
        # backward's recomputations all hoisted, their buffers alive at once). A region
        # computed from one cannot join it either (the merged region would feed itself);
        # a region that joins a bucket of its own (an optimizer's per-parameter update
        # reading its step's scalars) may read it: both merge, in the same order.
        member_of: dict[Value, int] = {}
        sealed: set[int] = set()
        tainted: dict[int, set[Value]] = {}  # values computed from each bucket's members
        for op in fn.ops:
            key = signature(op)
            for desc in tainted.values():
                if any(v in desc for v in op.operands):
                    desc.update(op.results)
            if key is None:
                sealed.update(member_of[v] for v in op.operands if v in member_of)
                continue
            open_ = buckets.setdefault(key, [[]])
            bucket = open_[-1]
            if len(bucket) >= self.max_members or id(bucket) in sealed or any(
                    v in tainted.get(id(bucket), ()) for v in op.operands):
                bucket = []
                open_.append(bucket)
            bucket.append(op)
            tainted.setdefault(id(bucket), set()).update(op.results)
            member_of.update(dict.fromkeys(op.results, id(bucket)))
        rewriter = Rewriter(fn)
        made = [self._merge(fn, group, rewriter) for groups in buckets.values()
                for group in groups if len(group) >= self.min_members]
        if made:
            _schedule(fn.body)
        self.count("num-horizontal", len(made))
        self.count("num-members", sum(made))

    @staticmethod
    def _merge(fn: Function, members: list[Operation], rewriter: Rewriter) -> int:
        """Replace `members` by one region holding them all; returns how many it holds."""
        region = Block()
        operands: list[Value] = []
        yielded: list[Value] = []
        for op in members:
            (inner,) = op.regions
            mapping = {a: region.add_arg(Value(a.type, rewriter.fresh_name(), None, 0))
                       for a in inner.args}
            operands += op.operands
            for o in inner.ops[:-1]:
                o.operands = [mapping.get(v, v) for v in o.operands]
                region.append(o)
            yielded += [mapping.get(v, v) for v in inner.terminator.operands]
        region.append(Operation(OPS["yield"], yielded, {}, [], []))
        merged = Operation(OPS["fused"], operands, {"kind": "memory", "members": len(members)},
                           [v.type for v in yielded], [rewriter.fresh_name() for _ in yielded],
                           regions=[region], loc=members[0].loc)
        merged.parent = fn.body
        renamed = dict(zip([r for op in members for r in op.results], merged.results,
                           strict=True))
        gone = set(members)
        ops = []
        for op in fn.body.ops:
            if op is members[-1]:
                ops.append(merged)
            elif op not in gone:
                op.operands = [renamed.get(v, v) for v in op.operands]
                ops.append(op)
        fn.body.ops = ops
        return len(members)
