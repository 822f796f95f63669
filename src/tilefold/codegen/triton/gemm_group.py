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
from tilefold.ir import Block, Function, Operation, Value
from tilefold.ir.types import SymDim, TensorType
from tilefold.target.gpu import GPUTarget

GEMM_DTYPES = frozenset({"f32", "f16", "bf16"})  # of the group's tensors (fp8: the template)


@dataclass(frozen=True)
class GemmPlan:
    """What the template runs for one set of shapes: the matmul, its epilogue program (None:
    none), the epilogue's tensors (group inputs or constants) and what each output holds."""

    matmul: Operation
    program: Any
    extra: tuple[Value, ...]
    stores: tuple[int | None, ...]
    out_dtypes: tuple[str, ...]
    c_round: str | None


def _ops(group: Function | Block) -> tuple[list[Value], list[Operation], list[Value]]:
    block = group.body if isinstance(group, Function) else group
    *ops, ret = block.ops
    return list(block.args), ops, list(ret.operands)


def plan_gemm(group: Function | Block, bindings: dict[str, int]) -> GemmPlan:
    """The template's plan for `group` with its symbolic dims bound; `UnsupportedError` saying
    why when the group is not one matmul (of rank >= 2 operands, no prologue) and an
    elementwise epilogue the template can fuse."""
    args, ops, outputs = _ops(group)
    body = [op for op in ops if op.name != "constant"]
    name = getattr(group, "name", "fused")
    if [op.name for op in body[:1]] != ["matmul"] or any(op.name == "matmul" for op in body[1:]):
        raise UnsupportedError(f"@{name}: the Triton GEMM template takes one matmul first "
                               f"(ops: {', '.join(op.name for op in body)}); prologue ops "
                               "must be views the operands' strides can express")
    mm, epilogue = body[0], body[1:]
    types: dict[Value, TensorType] = {}
    for op in ops:
        for v in [*op.operands, *op.results]:
            types[v] = v.type.bind(bindings)
    for v in args:
        types[v] = v.type.bind(bindings)
    for v in types.values():
        if any(isinstance(d, SymDim) for d in v.shape):
            raise ShapeError(f"@{name}: symbolic dims of {v} are not bound")
    bad = sorted({str(t.dtype) for t in types.values()} - GEMM_DTYPES)
    if bad:
        raise UnsupportedError(f"@{name}: the Triton GEMM of a graph group takes "
                               f"{'/'.join(sorted(GEMM_DTYPES))} tensors, not {', '.join(bad)}")
    if any(len(types[v].shape) < 2 for v in mm.operands):
        raise UnsupportedError(f"@{name}: a matrix-vector matmul is memory-bound (a GEMV), "
                               "not the GEMM template's")
    c = mm.results[0]
    extra = tuple(dict.fromkeys(v for op in epilogue for v in op.operands
                                if v is not c and v.defining_op not in epilogue))
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
    return GemmPlan(mm, program, extra, stores, tuple(str(types[v].dtype) for v in outputs),
                    dtype if dtype != "f32" else None)


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
    fresh tensors on their device."""

    def __init__(self, group: Function | Block, target: GPUTarget, split: str = "none"):
        self.group, self.target, self.split = group, target, split
        self.params, self.ops, _ = _ops(group)
        self._made: dict[tuple, tuple[GemmPlan, Any]] = {}

    def plan(self, *tensors: Any) -> GemmPlan:
        return self._prepare(tensors)[0]

    def _prepare(self, tensors: Sequence[Any]) -> tuple[GemmPlan, Any]:
        from tilefold.codegen.triton.gemm_launch import TritonGemm

        key = tuple(tuple(t.shape) for t in tensors)
        if key not in self._made:
            plan = plan_gemm(self.group, _bind(self.params, key))
            dtype = str(plan.matmul.operands[0].type.dtype)
            gemm = TritonGemm(dtype, dtype, epilogue=plan.program, stores=plan.stores,
                              c_round=plan.c_round, split=self.split,
                              out_dtypes=plan.out_dtypes)
            self._made[key] = (plan, gemm)
        return self._made[key]

    def __call__(self, *tensors: Any, config: GemmConfig | None = None) -> list[Any]:
        import torch

        plan, gemm = self._prepare(tensors)
        values: dict[Value, Any] = dict(zip(self.params, tensors, strict=True))
        for op in self.ops:
            if op.name == "constant":
                values[op.results[0]] = torch.from_numpy(
                    np.asarray(op.attrs["value"], np.float32)).to(tensors[0].device)
        mm = plan.matmul
        a, b = (values[v] for v in mm.operands)
        if mm.attr("transpose_a"):
            a = a.transpose(-1, -2)
        if mm.attr("transpose_b"):
            b = b.transpose(-1, -2)
        if config is None:
            m, k = a.shape[-2:]
            best = propose_configs(self.target, m, b.shape[-1], k,
                                   str(mm.operands[0].type.dtype))[0]
            config = dataclasses.replace(
                best, split_k=1 if self.split == "none" else max(2, best.split_k))
        return gemm(a, b, epilogue_inputs=[values[v] for v in plan.extra], config=config)


__all__ = ["GemmPlan", "TritonGemmGroup", "plan_gemm"]
