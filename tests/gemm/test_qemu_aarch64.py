"""The NEON GEMM cross-compiled for aarch64, linked static (own `_start`, no libc) and run under
qemu-user: correctness on a real ISA the machine does not have. Needs Debian's
`qemu-user-static` and `lld`; skipped when they are not installed."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from tests.gemm.reference import check_matmul
from tilefold.codegen.llvm.gemm.driver import BMode, Param
from tilefold.codegen.llvm.gemm.module import gemm_ir
from tilefold.codegen.llvm.gemm.registry import select_microkernel
from tilefold.runtime import emit_object
from tilefold.target import named_target

QEMU = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
LLD = shutil.which("ld.lld")
pytestmark = pytest.mark.skipif(not (QEMU and LLD), reason="needs qemu-user-static and lld")


def _floats(values: np.ndarray) -> str:
    return ", ".join(f"float {_exact(v)}" for v in values.ravel())


def _exact(v: np.float32) -> str:
    """LLVM IR spells a float constant as the hex of the double it widens to."""
    return "0x" + np.float64(v).view(np.uint64).item().to_bytes(8, "big").hex().upper()


def harness(a: np.ndarray, b_stored: np.ndarray, m: int, n: int, k: int, blocking) -> str:
    """`_start`: C = A @ B (B given transposed), write C's bytes to stdout, exit 0."""
    mc, kc, nc = blocking
    ws = mc * kc + kc * nc + 64
    slots = {Param.M: m, Param.N: n, Param.K: k, Param.RSA: k, Param.CSA: 1, Param.RSB: 1,
             Param.CSB: k, Param.RSC: n, Param.BETA: 0, Param.BATCH: 1, Param.TM: 1,
             Param.TN: 1, Param.THREADS: 1, Param.BMODE: int(BMode.PACK),
             Param.WS_PER_THREAD: ws, Param.MC: mc, Param.KC: kc, Param.NC: nc,
             Param.DATA_OFFSET: -1, Param.N_UNIT: 4, Param.STREAM: 1}
    params = []
    for slot in Param:
        if slot == Param.OFFSETS:
            params.append("i64 ptrtoint (ptr @offs to i64)")
        else:
            params.append(f"i64 {slots[slot]}")
    return f"""
target triple = "aarch64-unknown-linux-gnu"
@offs = global [3 x i64] zeroinitializer
@params = global [{len(Param)} x i64] [{", ".join(params)}]
@A = global [{m * k} x float] [{_floats(a)}]
@B = global [{n * k} x float] [{_floats(b_stored)}]
@C = global [{m * n} x float] zeroinitializer, align 64
@ws = global [{ws} x float] zeroinitializer, align 64
; syscall(x0, x1, x2, number): mov x8, x3; svc #0; ret (machine words: no asm parser needed)
@sys = constant [3 x i32] [i32 u0xAA0303E8, i32 u0xD4000001, i32 u0xD65F03C0], section ".text"
declare void @tf_gemm(ptr, ptr, ptr, ptr, ptr)
define void @tilefold_parallel(ptr %fn, ptr %ctx, i32 %n) {{
  call void %fn(ptr %ctx, i32 0, i32 1)
  ret void
}}
define void @_start() {{
  call void @tf_gemm(ptr @params, ptr @A, ptr @B, ptr @C, ptr @ws)
  %w = call i64 @sys(i64 1, ptr @C, i64 {4 * m * n}, i64 64)
  %e = call i64 @sys(i64 0, ptr null, i64 0, i64 93)
  unreachable
}}
"""


@pytest.mark.parametrize("m, n, k", [(13, 29, 37), (8, 12, 5), (1, 1, 1)])
def test_neon_gemm_under_qemu(tmp_path, m, n, k):
    target = named_target("neoverse-v1")
    kernel = select_microkernel(target)
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    bt = rng.standard_normal((n, k), dtype=np.float32)  # B = bt.T, column-major
    blocking = (2 * kernel.mr, 16, 2 * kernel.nr)  # small blocks: several K and N blocks
    gemm_o, main_o, exe = tmp_path / "gemm.o", tmp_path / "main.o", tmp_path / "gemm"
    gemm_o.write_bytes(emit_object(gemm_ir(target, kernel), target))
    main_o.write_bytes(emit_object(harness(a, bt, m, n, k, blocking), target))
    subprocess.run([LLD, "-static", "-e", "_start", "-o", exe, main_o, gemm_o], check=True)
    out = subprocess.run([QEMU, "-cpu", "max", exe], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = np.frombuffer(out.stdout, np.float32).reshape(m, n)
    check_matmul(got, a, bt.T)
