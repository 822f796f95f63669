"""The JIT: compile, link and call generated functions; clear errors instead of crashes."""

from __future__ import annotations

import ctypes
import logging

import numpy as np
import pytest

from tilefold.errors import CompileError
from tilefold.runtime import compile_llvm_ir, emit_assembly
from tilefold.target import host_target

ADD = """
define i32 @add(i32 %a, i32 %b) {
entry:
  %c = add i32 %a, %b
  ret i32 %c
}
@answer = global i32 42
"""

# A dot product written plainly; opt_level 2 lets LLVM's middle end vectorize it.
DOT = """
define float @dot(ptr %x, ptr %y, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i.next, %body ]
  %acc = phi float [ 0.0, %entry ], [ %acc.next, %body ]
  %more = icmp ult i64 %i, %n
  br i1 %more, label %body, label %done
body:
  %px = getelementptr float, ptr %x, i64 %i
  %py = getelementptr float, ptr %y, i64 %i
  %vx = load float, ptr %px, align 4
  %vy = load float, ptr %py, align 4
  %m = fmul float %vx, %vy
  %acc.next = fadd float %acc, %m
  %i.next = add i64 %i, 1
  br label %loop
done:
  ret float %acc
}
"""

VFMA = """
declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)
define void @axpy8(ptr %a, ptr %x, ptr %y) {
entry:
  %va = load <8 x float>, ptr %a, align 4
  %vx = load <8 x float>, ptr %x, align 4
  %vy = load <8 x float>, ptr %y, align 4
  %r = call <8 x float> @llvm.fma.v8f32(<8 x float> %va, <8 x float> %vx, <8 x float> %vy)
  store <8 x float> %r, ptr %y, align 4
  ret void
}
"""


def test_compile_and_call(caplog):
    with caplog.at_level(logging.INFO, logger="tilefold.kernels"):
        module = compile_llvm_ir(ADD, host_target(), name="add")
    add = module.function("add", ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)
    assert add(2, 40) == 42
    assert module.function("add", ctypes.c_int32, ctypes.c_int32, ctypes.c_int32) is add
    assert ctypes.c_int32.from_address(module.address("answer")).value == 42
    assert module.compile_seconds > 0
    assert any("add" in record.message for record in caplog.records)


def test_same_ir_twice_gives_the_same_module():
    assert compile_llvm_ir(ADD, host_target(), name="add") is compile_llvm_ir(
        ADD, host_target(), name="add"
    )


def test_middle_end_pipeline_runs_when_asked():
    module = compile_llvm_ir(DOT, host_target(), name="dot", opt_level=2)
    dot = module.function("dot", ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    x = np.arange(100, dtype=np.float32)
    assert dot(x.ctypes.data, x.ctypes.data, 100) == pytest.approx(float(x @ x), rel=1e-6)


def test_avx2_target_code_runs_here():
    host = host_target()
    if not host.has("avx2", "fma"):
        pytest.skip("host has no AVX2")
    target = host_target("x86-64-v3")
    assembly = emit_assembly(VFMA, target)
    assert "vfmadd" in assembly and "zmm" not in assembly
    module = compile_llvm_ir(VFMA, target, name="axpy8")
    axpy8 = module.function("axpy8", None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    a, x, y = (np.full(8, v, np.float32) for v in (2.0, 3.0, 1.0))
    axpy8(a.ctypes.data, x.ctypes.data, y.ctypes.data)
    assert (y == 7.0).all()


def test_missing_symbol_is_a_compile_error():
    module = compile_llvm_ir(ADD, host_target(), name="add")
    with pytest.raises(CompileError, match="exports no symbol 'sub'"):
        module.address("sub")


def test_invalid_ir_is_a_compile_error():
    with pytest.raises(CompileError, match="broken"):
        compile_llvm_ir("define i32 @f( {", host_target(), name="broken")


def test_unresolvable_external_is_a_compile_error_not_a_crash():
    text = """
declare i32 @tilefold_no_such_function(i32)
define i32 @g(i32 %a) {
entry:
  %r = call i32 @tilefold_no_such_function(i32 %a)
  ret i32 %r
}
"""
    with pytest.raises(CompileError, match="cannot link"):
        compile_llvm_ir(text, host_target(), name="unresolved")


def test_libm_functions_resolve():
    text = """
declare float @expf(float)
define float @e(float %x) {
entry:
  %r = call float @expf(float %x)
  ret float %r
}
"""
    module = compile_llvm_ir(text, host_target(), name="libm")
    assert module.function("e", ctypes.c_float, ctypes.c_float)(0.0) == 1.0
