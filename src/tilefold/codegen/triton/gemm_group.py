"""A graph-IR compute group (one matmul and its elementwise epilogue) as the Triton GEMM
template, called on torch tensors: the epilogue becomes a row program over C's rows at the
call's concrete shapes, with each operand's role read from the IR's axis classes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefold.codegen.rowprog.program import NotARowProgram, build_program
from tilefold.codegen.triton.gemm_config import GemmConfig, propose_configs
from tilefold.errors import ShapeError, UnsupportedError
from tilefold.ir import OPS, Block, Function, Operation, Value
from tilefold.ir.types import SymDim, TensorType
from tilefold.target.gpu import GPUTarget

GEMM_DTYPES = frozenset({"f32", "f16", "bf16"})  # of the group's tensors (fp8: the template)
VIEWS = frozenset({"transpose", "broadcast_to", "expand_dims"})  # strides, no copy
GRAPH_CODES = ("i8", "u8", "fp8e4m3")  # weight codes a graph group's dequantize may read


@dataclass(frozen=True)
class GemmPlan:
    """What the template runs for one set of shapes: the matmul, the view ops from each of its
    operands' roots (a group input, or a `dequantize`'s codes and scales for B) outwards, the
    dequantize (None: none), its epilogue program (None: none), the epilogue's tensors (group
    inputs or constants) and what each output holds."""

    matmul: Operation
    views: tuple[tuple[Operation, ...], tuple[Operation, ...]]
    dequantize: Operation | None
    program: Any
    extra: tuple[Value, ...]
    stores: tuple[int | None, ...]
    out_dtypes: tuple[str, ...]
    c_round: str | None
    shapes: dict[Value, tuple[int, ...]]  # of each view's result, at these sizes


def _ops(group: Function | Block) -> tuple[list[Value], list[Operation], list[Value]]:
    block = group.body if isinstance(group, Function) else group
    *ops, ret = block.ops
    return list(block.args), ops, list(ret.operands)


def _chain(name: str, v: Value, prologue: list[Operation], b_side: bool
           ) -> tuple[tuple[Operation, ...], Operation | None]:
    """The view ops from `v`'s root to `v` (outermost last), and the dequantize at the root."""
    views: list[Operation] = []
    op = v.defining_op
    while op is not None and op in prologue and op.name in VIEWS:
        views.insert(0, op)
        op = op.operands[0].defining_op
    if op is None or op not in prologue:
        return tuple(views), None
    if op.name != "dequantize" or not b_side:
        why = ("a cast has no in-kernel conversion in the template yet; cast outside the group"
               if op.name == "cast" else "only B's weights dequantize in the template")
        raise UnsupportedError(f"@{name}: prologue '{op.name}' of the matmul's "
                               f"{'B' if b_side else 'A'}: {why}")
    return tuple(views), op


def plan_gemm(group: Function | Block, bindings: dict[str, int]) -> GemmPlan:
    """The template's plan for `group` with its symbolic dims bound; `UnsupportedError` saying
    why when the group is not one matmul of rank >= 2 operands, reached from its inputs by
    views (and, for B, a `dequantize` of int8, uint8 with zero points, or fp8 codes), and an
    elementwise epilogue."""
    args, ops, outputs = _ops(group)
    body = [op for op in ops if op.name != "constant"]
    name = getattr(group, "name", "fused")
    matmuls = [op for op in body if op.name == "matmul"]
    if len(matmuls) != 1:
        raise UnsupportedError(f"@{name}: the Triton GEMM template takes one matmul, not "
                               f"{len(matmuls)} (ops: {', '.join(op.name for op in body)})")
    mm = matmuls[0]
    at = body.index(mm)
    prologue, epilogue = body[:at], body[at + 1:]
    (a_views, _), (b_views, b_deq) = (_chain(name, v, prologue, side)
                                      for v, side in zip(mm.operands, (False, True),
                                                         strict=True))
    used = {*a_views, *b_views, *([b_deq] if b_deq else [])}
    stray = [op.name for op in prologue if op not in used]
    if stray:
        raise UnsupportedError(f"@{name}: prologue ops {', '.join(stray)} feed no operand of "
                               "the matmul")
    types: dict[Value, TensorType] = {}
    for op in ops:
        for v in [*op.operands, *op.results]:
            types[v] = v.type.bind(bindings)
    for v in args:
        types[v] = v.type.bind(bindings)
    for v in types.values():
        if any(isinstance(d, SymDim) for d in v.shape):
            raise ShapeError(f"@{name}: symbolic dims of {v} are not bound")
    codes = {b_deq.operands[0], *b_deq.operands[2:]} if b_deq else set()  # and zero points
    bad = sorted({str(t.dtype) for v, t in types.items() if v not in codes} - GEMM_DTYPES)
    if bad:
        raise UnsupportedError(f"@{name}: the Triton GEMM of a graph group takes "
                               f"{'/'.join(sorted(GEMM_DTYPES))} tensors, not {', '.join(bad)}")
    if codes and str(types[b_deq.operands[0]].dtype) not in GRAPH_CODES:
        raise UnsupportedError(f"@{name}: dequantize of {types[b_deq.operands[0]].dtype} codes: "
                               f"the graph path takes {'/'.join(GRAPH_CODES)} (int4 codes have "
                               "no torch dtype; pass packed int4 weights to TritonGemm)")
    if any(len(types[v].shape) < 2 for v in mm.operands):
        raise UnsupportedError(f"@{name}: a matrix-vector matmul is memory-bound (a GEMV), "
                               "not the GEMM template's")
    c = mm.results[0]
    extra = tuple(dict.fromkeys(v for op in epilogue for v in op.operands
                                if v is not c and v.defining_op not in epilogue))
    shared = [f"%{v.name}" for v in extra if v.defining_op in prologue]
    if shared:
        raise UnsupportedError(f"@{name}: the epilogue reads {', '.join(shared)}, a prologue "
                               "value; give it to the group as an input")
    outs = [v for v in outputs if v is not c]
    program = None
    if epilogue:
        try:
            program = build_program(types, {}, epilogue, [c, *extra], outs, c,
                                    io=GEMM_DTYPES)
        except NotARowProgram as exc:
            raise UnsupportedError(f"@{name}: epilogue: {exc}") from None
    ids = dict(zip(outs, [v for v, _ in program.outputs], strict=True)) if program else {}
    stores = tuple(None if v is c else ids[v] for v in outputs)
    dtype = str(types[c].dtype)
    shapes = {op.results[0]: tuple(types[op.results[0]].shape) for op in (*a_views, *b_views)}
    return GemmPlan(mm, (a_views, b_views), b_deq, program, extra, stores,
                    tuple(str(types[v].dtype) for v in outputs), dtype if dtype != "f32" else None,
                    shapes)


def _view(op: Operation, t: Any, shape: tuple[int, ...], scale: bool = False) -> Any:
    """`op` (a view whose result has `shape`) applied to the torch tensor `t`; for a scale
    tensor (`scale`), only the batch dims a broadcast adds (its last two dims are blocks)."""
    if op.name == "transpose":
        return t.permute(*op.attr("perm"))
    if op.name == "expand_dims":
        rank = t.dim() + len(op.attr("axes"))
        for axis in sorted(a % rank for a in op.attr("axes")):
            t = t.unsqueeze(axis)
        return t
    return t.expand(*shape[:-2], *t.shape[-2:]) if scale else t.expand(*shape)


def _bind(params: Sequence[Value], shapes: Sequence[tuple[int, ...]]) -> dict[str, int]:
    bindings: dict[str, int] = {}
    for p, shape in zip(params, shapes, strict=True):
        if len(shape) != p.type.rank:
            raise ShapeError(f"input %{p.name} expects {p.type}, got shape {list(shape)}")
        for d, size in zip(p.type.shape, shape, strict=True):
            if isinstance(d, SymDim) and bindings.setdefault(d.name, size) != size:
                raise ShapeError(f"input %{p.name}: ?{d.name} is {bindings[d.name]} elsewhere "
                                 f"but {size} here")
    return bindings


class TritonGemmGroup:
    """`group` (a compute group: matmul + epilogue) for `target`, split over K as `split`
    says ("none", "workspace", "atomic"); call it with torch tensors and get its outputs as
    fresh tensors on their device. A persistent `config` runs the TMA variant where the
    operands suit it and the same tiles with pointer loads where they do not."""

    def __init__(self, group: Function | Block, target: GPUTarget, split: str = "none"):
        self.group, self.target, self.split = group, target, split
        self.params, self.ops, _ = _ops(group)
        self._made: dict[tuple, tuple[GemmPlan, Any]] = {}
        self._consts: dict[str, dict[Value, Any]] = {}  # per device

    def plan(self, *tensors: Any) -> GemmPlan:
        """What the template runs for tensors of these shapes."""
        return self._prepare(tensors)[0]

    def source(self, *tensors: Any) -> str:
        """The Triton source that runs for tensors of these shapes."""
        return self._prepare(tensors)[1].source

    def _prepare(self, tensors: Sequence[Any]) -> tuple[GemmPlan, Any]:
        from tilefold.codegen.triton.gemm_launch import TritonGemm

        key = tuple(tuple(t.shape) for t in tensors)
        if key not in self._made:
            plan = plan_gemm(self.group, _bind(self.params, key))
            dtype = str(plan.matmul.operands[0].type.dtype)
            deq = plan.dequantize
            gemm = TritonGemm(dtype, str(deq.operands[0].type.dtype) if deq else dtype,
                              epilogue=plan.program, stores=plan.stores, c_round=plan.c_round,
                              split=self.split, out_dtypes=plan.out_dtypes,
                              zero_point=deq is not None and len(deq.operands) > 2)
            self._made[key] = (plan, gemm)
        return self._made[key]

    def dot_dtype(self, *tensors: Any) -> str:
        """The dtype the template's dot reads for tensors of these shapes."""
        return str(self.plan(*tensors).matmul.operands[0].type.dtype)

    def tma(self, *tensors: Any) -> bool:
        """Whether the persistent TMA variant can run on these tensors (A and B as the
        template reads them suit tensor descriptors: `gemm_launch.tma_order`)."""
        _, gemm = self._prepare(tensors)
        a, b, _, _ = self._operands(tensors)
        return gemm.tma_order(a, b) is not None

    def mnk(self, *tensors: Any) -> tuple[int, int, int]:
        """The GEMM's M, N, K for these tensors (after the prologue's views and transposes)."""
        a, b, _, _ = self._operands(tensors)
        return int(a.shape[-2]), int(b.shape[-1]), int(a.shape[-1])

    def _constants(self, device: Any) -> dict[Value, Any]:
        """The group's constants as f32 tensors on `device`, copied there once."""
        import torch

        key = str(device)
        if key not in self._consts:
            self._consts[key] = {
                op.results[0]: torch.from_numpy(
                    np.asarray(op.attrs["value"], np.float32)).to(device)
                for op in self.ops if op.name == "constant"}
        return self._consts[key]

    def _operands(self, tensors: Sequence[Any]) -> tuple[Any, Any, list[Any], dict]:
        """A and B as the template reads them, B's scales and zero points, and every value."""
        plan, _ = self._prepare(tensors)
        values: dict[Value, Any] = dict(zip(self.params, tensors, strict=True))
        values.update(self._constants(tensors[0].device))
        mm = plan.matmul
        roots = [_root(v, views) for v, views in zip(mm.operands, plan.views, strict=True)]
        a = values[roots[0]]
        deq = plan.dequantize
        b, *blocks = [values[v] for v in deq.operands] if deq else [values[roots[1]]]
        for op in plan.views[0]:
            a = _view(op, a, plan.shapes[op.results[0]])
        for op in plan.views[1]:
            b = _view(op, b, plan.shapes[op.results[0]])
            blocks = [_view(op, t, plan.shapes[op.results[0]], True) for t in blocks]
        if mm.attr("transpose_a"):
            a = a.transpose(-1, -2)
        if mm.attr("transpose_b"):
            b = b.transpose(-1, -2)
            blocks = [t.transpose(-1, -2) for t in blocks]
        return a, b, blocks, values

    def __call__(self, *tensors: Any, config: GemmConfig | None = None) -> list[Any]:
        plan, gemm = self._prepare(tensors)
        a, b, blocks, values = self._operands(tensors)
        scale, zero = [*blocks, None, None][:2]
        if config is None:
            m, k = a.shape[-2:]
            best = propose_configs(self.target, m, b.shape[-1], k,
                                   str(plan.matmul.operands[0].type.dtype))[0]
            config = dataclasses.replace(
                best, split_k=1 if self.split == "none" else max(2, best.split_k))
        if config.persistent and gemm.tma_order(a, b) is None:
            # a tuned persistent config, but these operands' data is placed where TMA cannot
            # copy it (same shapes and strides, so the same tuning key): the pointer variant
            config = dataclasses.replace(config, persistent=0)
        return gemm(a, b, scale=scale, zero_point=zero,
                    epilogue_inputs=[values[v] for v in plan.extra], config=config)


def _root(v: Value, views: tuple[Operation, ...]) -> Value:
    """The value the first of `views` reads (`v` itself without views)."""
    return views[0].operands[0] if views else v




def epilogue_block(c: Value, ops: Sequence[Operation], yielded: Sequence[Value]
                    ) -> tuple[Block, list[Value], list[Value]]:
    """A region computing the epilogue `ops` from C and their other inputs: (block, the
    outer values its arguments stand for, the outer values it yields)."""
    made = {r for o in ops for r in o.results}
    ins = [c, *dict.fromkeys(v for o in ops for v in o.operands if v not in made and v is not c)]
    block = Block([Value(TensorType(v.type.shape, v.type.dtype), f"a{i}", None, i)
                   for i, v in enumerate(ins)])
    remap = dict(zip(ins, block.args, strict=True))
    for o in ops:
        clone = Operation(o.opdef, [remap[v] for v in o.operands], o.attrs,
                          [r.type for r in o.results], [r.name for r in o.results])
        block.append(clone)
        remap.update(zip(o.results, clone.results, strict=True))
    outs = [v for v in yielded if v in made]
    block.append(Operation(OPS["yield"], [remap[v] for v in outs], {}, [], []))
    return block, ins, outs


__all__ = ["GemmPlan", "TritonGemmGroup", "epilogue_block", "plan_gemm"]
