"""What keeps a GEMM's first call short: a module compiles on first use, so a product a plan
routes to another shape class's module never compiles the one it was planned with; modules are
compiled without LLVM's loop strength reduction, a process-wide flag set only for their compile."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gemm.reference import check_matmul
from tilefold.codegen.llvm.gemm.module import GemmModule
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.registry import select_microkernel
from tilefold.runtime import emit_assembly
from tilefold.target import host_target, named_target


def test_a_module_compiles_on_first_use():
    target = host_target()
    if select_microkernel(target, shape_class="rows").shape_class != "rows":
        pytest.skip("no rows kernel here: row-major A stays with the general kernel")
    general = GemmModule(target, select_microkernel(target))
    rng = np.random.default_rng(5)
    a = rng.standard_normal((50, 70), dtype=np.float32)
    b = rng.standard_normal((70, 20), dtype=np.float32)  # within every rows kernel's max_n
    c = np.full((50, 20), np.nan, np.float32)
    plan = make_plan(general, a, b, c, 0, 1)
    plan(a, b, c)
    check_matmul(c, a, b)
    assert plan.kernel.shape_class == "rows"
    assert "compiled" not in vars(general)


# p[i * s] = 1 for i < n: with strength reduction the address steps by s, without it each
# iteration multiplies.
_STRIDED_STORES = """
define void @f(ptr %p, i64 %n, i64 %s) {
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%next, %body]
  %go = icmp slt i64 %i, %n
  br i1 %go, label %body, label %done
body:
  %off = mul i64 %i, %s
  %q = getelementptr inbounds float, ptr %p, i64 %off
  store float 1.0, ptr %q, align 4
  %next = add i64 %i, 1
  br label %head
done:
  ret void
}
"""


def test_strength_reduction_is_left_out_only_where_asked():
    target = named_target("x86-64-v4")
    assert "imul" in emit_assembly(_STRIDED_STORES, target, strength_reduce=False)
    assert "imul" not in emit_assembly(_STRIDED_STORES, target)
