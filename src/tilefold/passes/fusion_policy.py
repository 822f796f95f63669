"""What one backend's kernels can hold, as the fusion planner asks it: a policy per backend.

The planner (`passes/fusion.py`) decides whether ops line up over one iteration space
(`ir/axes.py`); the policy decides what the backend can compile as one kernel: which ops start
a compute group, which producers a GEMM takes in as operand prologues (and which of those are
mere views, free to copy per consumer), and which reductions a GEMM epilogue may hold.

Passes sit below codegen, so the table lives here: each backend gives its policy
(`Backend.fusion`, `codegen/backend/base.py`), registered under the backend's name when the
backend is; `fusion{backend=NAME}` asks that one. The CPU's (the LLVM backend's) is declared
here as well, so that fusion runs without codegen imported (`tilefold opt`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tilefold.errors import TilefoldError, UnsupportedError, lookup
from tilefold.ir import Operation
from tilefold.ir.types import Dim


@dataclass(frozen=True)
class FusionPolicy:
    """`compute_ops` start a compute group; `prologue_ops` producing a GEMM operand join it
    (one with other users only if it is in `free_prologues`, a view: copied per consumer).
    A backend whose epilogues reduce otherwise overrides `why_not_epilogue_reduction`."""

    compute_ops: frozenset[str]
    prologue_ops: frozenset[str]
    free_prologues: frozenset[str]

    def starts_compute(self, op: Operation) -> bool:
        return op.name in self.compute_ops

    def why_not_epilogue_reduction(self, axes: tuple[int, ...], source: Sequence[Dim],
                                   max_row: int) -> str | None:
        """Why a reduction of `source` (a value over C's space) over `axes` may not join a
        GEMM's epilogue, rows of at most `max_row` elements (None: it may)."""
        if axes != (len(source) - 1,):
            return "a GEMM epilogue may reduce only the last axis (rows of C)"
        if isinstance(source[-1], int) and source[-1] > max_row:
            return f"a row of {source[-1]} exceeds the epilogue row limit {max_row}"
        return None


# The CPU's: the BLIS-shaped GEMM reads strided, broadcast and (at packing time) converted or
# dequantized operands, and runs its epilogue as a row program over rows of C.
CPU_FUSION = FusionPolicy(
    compute_ops=frozenset({"matmul"}),
    prologue_ops=frozenset({"transpose", "broadcast_to", "expand_dims", "cast", "dequantize"}),
    free_prologues=frozenset({"transpose", "broadcast_to", "expand_dims"}),
)

FUSION_POLICIES: dict[str, FusionPolicy] = {"llvm": CPU_FUSION}


def register_fusion_policy(backend: str, policy: FusionPolicy) -> None:
    """Make `policy` the one `fusion{backend=NAME}` follows; a second, different one is an
    error."""
    if FUSION_POLICIES.setdefault(backend, policy) != policy:
        raise TilefoldError(f"backend {backend!r} has a fusion policy already")


def fusion_policy(backend: str) -> FusionPolicy:
    """The fusion policy of the backend named `backend`."""
    return lookup(FUSION_POLICIES, backend, "backend fusion policy", UnsupportedError)
