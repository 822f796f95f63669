"""bucket-all-reduces: pack small independent spmd.all_reduces of one axis, reduction and dtype
into one (flatten, concat, one all_reduce, slice and reshape back), as DDP buckets gradients;
on the per-rank program (after spmd-partition).

    %a = spmd.all_reduce(%x) {axis = "dp", size = 2} : f32[4,8]
    %b = spmd.all_reduce(%y) {axis = "dp", size = 2} : f32[8]
        ->  %f = reshape(%x) {shape = [32]} : f32[32]     %g = reshape(%y) {shape = [8]}
            %c = concat(%f, %g) {axis = 0} : f32[40]
            %r = spmd.all_reduce(%c) {axis = "dp", size = 2} : f32[40]
            %a = reshape(slice(%r) [0:32]) {shape = [4,8]}    %b = slice(%r) [32:40]

Each collective pays a latency (alpha) besides its bytes; one message instead of several pays
it once. Why the per-rank program: the packing flattens and joins blocks, and a block of a
tensor split on another mesh axis is not a block of its flattened global tensor, so the global
program cannot say it; the per-rank program is what the runtime sends, block by block.

A collective joins the open bucket of its kind if it is smaller than `threshold` bytes, the
bucket stays within `bucket-cap` bytes, and no member's result is used before it (so none
depends on another); the packed all_reduce takes the place of the last member.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tilefold.errors import PassError, TilefoldError
from tilefold.ir import Function
from tilefold.ir.core import Operation, Value
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter


def block_bytes(v: Value) -> int:
    return math.prod(v.type.shape) * v.type.dtype.bits // 8


@dataclass
class Bucket:
    """All_reduces waiting to be packed, and the first op index that uses one of them."""

    members: list[Operation] = field(default_factory=list)
    nbytes: int = 0
    deadline: float = math.inf


@register_pass
class BucketAllReduces(Pass):
    """Pack small independent spmd.all_reduces of one axis and dtype into one."""

    options = (
        Option("threshold", int, 1 << 16, "an all_reduce of fewer bytes than this may be packed"),
        Option("bucket-cap", int, 1 << 20, "the most bytes one packed all_reduce carries"),
    )
    statistics = (
        Statistic("num-packed", "all_reduces packed into buckets"),
        Statistic("num-buckets", "packed all_reduces made"),
    )

    def run_on_function(self, fn: Function) -> None:
        ops = list(fn.body.ops)
        first_use: dict[Value, int] = {}
        for i, op in enumerate(ops):
            for v in op.operands:
                first_use.setdefault(v, i)
        open_: dict[tuple, Bucket] = {}
        full: list[Bucket] = []
        for i, op in enumerate(ops):
            if op.name != "spmd.all_reduce" or not op.operands[0].type.is_static:
                continue
            size = block_bytes(op.operands[0])
            if size >= self.threshold:
                continue
            key = (op.attr("axis"), op.attr("size"), op.attr("reduce"), op.result.type.dtype)
            bucket = open_.get(key)
            if bucket is None or i >= bucket.deadline or bucket.nbytes + size > self.bucket_cap:
                if bucket is not None:
                    full.append(bucket)
                bucket = open_[key] = Bucket()
            bucket.members.append(op)
            bucket.nbytes += size
            bucket.deadline = min(bucket.deadline, first_use.get(op.result, math.inf))
        rewriter = Rewriter(fn)
        for bucket in [*full, *open_.values()]:
            if len(bucket.members) > 1:
                self.pack(bucket.members, rewriter)

    def pack(self, members: list[Operation], rewriter: Rewriter) -> None:
        """One all_reduce of the members' flattened blocks, in place of the last member."""
        last = members[-1]
        try:
            flat = [self.reshaped(m.operands[0], [math.prod(m.operands[0].type.shape)], last,
                                  rewriter) for m in members]
            joined = rewriter.create(last, "concat", flat, {"axis": 0}).result
            reduced = rewriter.create(last, "spmd.all_reduce", [joined], last.attrs,
                                      loc=last.loc).result
            start = 0
            for m, f in zip(members, flat, strict=True):
                stop = start + f.type.shape[0]
                piece = rewriter.create(last, "slice", [reduced],
                                        {"starts": [start], "stops": [stop], "steps": [1]})
                back = self.reshaped(piece.result, list(m.result.type.shape), last, rewriter)
                start = stop
                name = m.result.name
                rewriter.replace(m, [back])
                back.name = name
        except TilefoldError as exc:  # every member is static and of one dtype: a bug if so
            raise PassError(f"bucket-all-reduces: {exc.message}") from None
        self.count("num-packed", len(members))
        self.count("num-buckets")

    @staticmethod
    def reshaped(v: Value, shape: list[int], before: Operation, rewriter: Rewriter) -> Value:
        """`v` with `shape` (itself if it has it)."""
        if list(v.type.shape) == shape:
            return v
        return rewriter.create(before, "reshape", [v], {"shape": shape}).result

