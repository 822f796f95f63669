"""Cross compilation: aarch64 assembly and objects, and refusing to run foreign code."""

from __future__ import annotations

import ctypes
import re

import pytest

from tilefold.errors import UnsupportedError
from tilefold.runtime import compile_llvm_ir, emit_assembly, emit_object
from tilefold.target import host_target, named_target

VFMA4 = """
declare <4 x float> @llvm.fma.v4f32(<4 x float>, <4 x float>, <4 x float>)
define void @fma4(ptr %a, ptr %x, ptr %y) {
entry:
  %va = load <4 x float>, ptr %a, align 4
  %vx = load <4 x float>, ptr %x, align 4
  %vy = load <4 x float>, ptr %y, align 4
  %r = call <4 x float> @llvm.fma.v4f32(<4 x float> %va, <4 x float> %vx, <4 x float> %vy)
  store <4 x float> %r, ptr %y, align 4
  ret void
}
"""
_EM_AARCH64, _EM_X86_64 = 183, 62


def test_neoverse_v1_assembly_uses_fmla():
    assembly = emit_assembly(VFMA4, named_target("neoverse-v1"))
    assert re.search(r"fmla\s+v\d+\.4s", assembly)


def test_objects_carry_the_target_machine_type():
    aarch64 = emit_object(VFMA4, named_target("neoverse-v1"))
    x86 = emit_object(VFMA4, named_target("x86-64-v3"))
    assert aarch64[:4] == x86[:4] == b"\x7fELF"
    assert int.from_bytes(aarch64[18:20], "little") == _EM_AARCH64
    assert int.from_bytes(x86[18:20], "little") == _EM_X86_64


@pytest.mark.skipif(host_target().arch != "x86_64", reason="needs a non-aarch64 host")
def test_running_aarch64_code_is_refused():
    module = compile_llvm_ir(VFMA4, named_target("neoverse-v1"), name="fma4_arm")
    assert not module.runnable and module.object_code[:4] == b"\x7fELF"
    with pytest.raises(UnsupportedError, match="cannot run"):
        module.address("fma4")
    with pytest.raises(UnsupportedError, match="neoverse-v1"):
        module.function("fma4", None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
