"""Modules using AMX get the process's AMX permission before they run (else: SIGILL)."""

from __future__ import annotations

import pytest

from tilefold.runtime.compile import _mentions
from tilefold.target import host_target

AMX_DOT = """
    import ctypes
    import numpy as np
    from tilefold.runtime import compile_llvm_ir
    from tilefold.target import host_target
    from tilefold.target.probes import amx_probe_ir
    module = compile_llvm_ir(amx_probe_ir("tdpbssd"), host_target(), name="amx_dot")
    probe = module.function("probe", None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
    inputs = np.zeros(64 + 2048, np.uint8)
    inputs[0] = 1
    inputs[16:32].view(np.uint16)[:] = 64
    inputs[48:56] = 16
    inputs[64:1088].view(np.int8)[:] = 1
    inputs[1088:].view(np.int8)[:] = 2
    out = np.zeros(4 * 256, np.int32)
    probe(3, inputs.ctypes.data, out.ctypes.data)
    print(sorted(set(out.tolist())))
"""


@pytest.mark.skipif(not host_target().has("amx-tile", "amx-int8"), reason="host has no AMX")
def test_amx_module_runs_in_a_fresh_process(run_python):
    # 3 iterations x 64 products of 1 x 2 in every int32 accumulator element
    assert run_python(AMX_DOT).strip() == "[384]"


def test_amx_use_is_recognised_in_quoted_names_too():
    assert _mentions('call void @"llvm.x86.tdpbf16ps"(i8 0, i8 1, i8 2)', "llvm.x86.tdp")
    assert _mentions("call void @llvm.x86.tileloadd64(i8 1, ptr %a, i64 64)", "llvm.x86.tile")
    assert not _mentions("call void @llvm.x86.avx512.vpdpbusd.512()", "llvm.x86.tile")
