"""Every low-precision driver path emits working assembly for every registered ISA it serves.

The host may lack the AVX-512, VNNI, BF16 or AMX kernels' ISA, so their modules are
compiled for named targets that have them and the assembly is checked for each registry row's
instruction, in its micro-kernel's inner loop, with nothing spilled to the stack there.
"""

from __future__ import annotations

import dataclasses

import pytest

from tilefold.codegen.llvm.gemm.module import CODEGEN_OPTIONS, gemm_ir
from tilefold.codegen.llvm.gemm.registry import select_microkernel
from tilefold.codegen.llvm.lowp.decode import choose_decoder
from tilefold.codegen.llvm.lowp.driver import lowp_gemm_ir
from tilefold.codegen.llvm.lowp.kernels import DOT_KERNELS
from tilefold.codegen.llvm.lowp.packgen import pack_b_ir
from tilefold.codegen.llvm.lowp.wgemv import WgemvSpec, wgemv_ir
from tilefold.codegen.llvm.lowp.wvnni import wvnni_ir
from tilefold.runtime import emit_assembly
from tilefold.target import named_target, target_names

# The instruction each dot step compiles to (AMX rows: their own mnemonic).
INSTRUCTION = {"dpbf16": "vdpbf16ps", "dpbf16_fma": "vfmadd231ps", "dpf16_fma": "vcvtph2ps",
               "dpbusd": "vpdpbusd", "dpbusd_pmaddwd": "vpmaddwd", "pmaddwd": "vpmaddwd"}


def target_of(kernel):
    """The first table target whose family chain reaches `kernel`'s family and that has its
    features (the row's own family where that has them; never the host, whose extra
    features, e.g. AVX-VNNI folding vpmaddwd + vpaddd, would change the code checked)."""
    for name in target_names()[1:]:
        target = named_target(name)
        if kernel.family in target.family and target.has(*kernel.features):
            return target
    raise AssertionError(f"no named target can run {kernel.name}")


def rows(driver: str, amx: bool | None = None) -> list:
    """The registry rows run by `driver` (AMX rows or not), as test parameters named after
    them."""
    return [pytest.param(k, id=k.name) for k in DOT_KERNELS
            if k.driver == driver and amx in (None, k.is_amx)]


WORKER = "tf_lowp_gemm_worker"


def function_lines(asm: str, name: str) -> list[str]:
    """The assembly lines of function `name` (its label to its `.size` line)."""
    lines = asm.splitlines()
    start = lines.index(f"{name}:")
    end = next(i for i in range(start, len(lines)) if lines[i].lstrip().startswith(".size"))
    return lines[start:end]


def loop_block(lines: list[str], mnemonic: str) -> list[str]:
    """The instructions of the basic block holding the first `mnemonic`."""
    first = next(i for i, line in enumerate(lines) if line.split()[:1] == [mnemonic])
    start = max(i for i in range(first) if lines[i].startswith(".LBB"))
    end = next(i for i in range(first, len(lines)) if lines[i].startswith(".LBB"))
    return [line for line in lines[start + 1:end] if line.startswith("\t")]


def a_codes(kernel) -> tuple[str, ...]:
    """The A codes the driver packs for `kernel` (dotpack.a_code over u8 and s8 A)."""
    if kernel.s16_codes:
        return ("zext", "sext")
    return ("copy", "flip") if kernel.shifts_signed_a else ("copy",)


@pytest.mark.parametrize("dequant", [False, True])
@pytest.mark.parametrize("kernel", rows("lowp", amx=False))
def test_dot_driver_emits_each_rows_instruction(kernel, dequant):
    for code in a_codes(kernel):
        check_dot_rows_assembly(kernel, code, dequant)


def check_dot_rows_assembly(kernel, code: str, dequant: bool) -> None:
    asm = emit_assembly(lowp_gemm_ir(kernel, target_of(kernel), code, dequant),
                        target_of(kernel))
    body = function_lines(asm, WORKER)
    loop = loop_block(body, INSTRUCTION[kernel.dot])
    assert not any("rsp" in line for line in loop), "\n".join(loop)
    register = "zmm" if kernel.lanes == 16 else "ymm"
    assert any(register in line for line in loop), "\n".join(loop)
    if dequant and not kernel.acc_is_float:
        assert "vcvtdq2ps" in "\n".join(body)
    if code == "flip":  # s8 A + 128 in packing, 128 * colsum(B) subtracted after
        assert "vpxor" in asm and "vpsubd" in "\n".join(body)


@pytest.mark.parametrize("kernel", [k for k in rows("lowp", amx=False)
                                    if k.values[0].s16_codes])
def test_s16_rows_are_one_pmaddwd_and_one_add_per_b_vector(kernel):
    """Codes widened while packing: the k loop holds MR x NV `vpmaddwd` and as many `vpaddd`,
    MR broadcasts and NV loads, no byte splitting (shifts, masks) and no spills; A's and B's
    packers widen their bytes."""
    target = target_of(kernel)
    asm = emit_assembly(lowp_gemm_ir(kernel, target, "sext"), target)
    loop = loop_block(function_lines(asm, WORKER), "vpmaddwd")
    ops = [line.split()[0] for line in loop]
    tile = kernel.mr * kernel.nv
    assert ops.count("vpmaddwd") == tile and ops.count("vpaddd") == tile, "\n".join(loop)
    loads = [op for op in ops if op.startswith("vmovdqu")]
    assert ops.count("vpbroadcastd") == kernel.mr and len(loads) == kernel.nv
    assert "vpmovsxbw" in "\n".join(function_lines(asm, "tf_lowp_pack_a"))
    assert not any(op.startswith(("vpsr", "vpsl", "vpand")) for op in ops), "\n".join(loop)
    assert not any("rsp" in line for line in loop), "\n".join(loop)
    packer = emit_assembly(pack_b_ir(kernel.nr, kernel.kgroup, target, widen_bytes=True),
                           target)
    assert "vpmovsxbw" in packer


@pytest.mark.parametrize("dequant", [False, True])
@pytest.mark.parametrize("kernel", rows("lowp", amx=True))
def test_amx_driver_emits_each_rows_instruction(kernel, dequant):
    asm = emit_assembly(lowp_gemm_ir(kernel, target_of(kernel), "copy", dequant),
                        target_of(kernel))
    loop = loop_block(asm.splitlines(), kernel.dot)
    assert [line.split()[0] for line in loop].count(kernel.dot) == 2
    assert not any("rsp" in line for line in loop)
    assert ("vcvtdq2ps" in asm) == dequant


@pytest.mark.parametrize("kernel", rows("f32"))
def test_widening_rows_emit_the_f32_gemm_with_widening_packing(kernel):
    target = target_of(kernel)
    micro = select_microkernel(target)
    asm = emit_assembly(gemm_ir(target, micro, kernel.dtype), target, **CODEGEN_OPTIONS)
    assert "vfmadd231ps" in asm
    widen = "vcvtph2ps" if kernel.dtype == "f16" else "vpslld"
    assert widen in "\n".join(function_lines(asm, "tf_pack_b"))


@pytest.mark.parametrize("target_name", ["x86-64-v3", "x86-64-v4"])
@pytest.mark.parametrize("code", ["i4", "fp4e2m1", "fp8e4m3", "i8"])
def test_weight_only_gemv_emits_for_each_vector_width(target_name, code):
    target = named_target(target_name)
    lanes = 16 if target.has("avx512f") else 8
    spec = WgemvSpec(choose_decoder(code, target), lanes, 4, 64, 2, True, True)
    asm = emit_assembly(wgemv_ir(spec, target), target)
    tile = "\n".join(function_lines(asm, "tf_wtile_2"))
    assert "vfmadd" in tile and ("zmm" if lanes == 16 else "ymm") in tile
    assert "vcvtph2ps" in tile  # f16 scales widened as they are loaded


@pytest.mark.parametrize(("target_name", "extra", "lanes"), [
    ("x86-64-v4", {"avx512vnni"}, 16),          # AVX512-VNNI
    ("x86-64-v3", {"avxvnni"}, 8),              # AVX-VNNI (VEX), no AVX-512
])
@pytest.mark.parametrize("code", ["i4", "i8"])
def test_integer_dot_gemv_emits_vpdpbusd(target_name, extra, lanes, code):
    base = named_target(target_name)
    target = dataclasses.replace(base, features=base.features | extra)
    spec = WgemvSpec(choose_decoder(code, target), lanes, 4, 32, 1, True, False, dot="vnni")
    asm = emit_assembly(wvnni_ir(spec, target), target)
    tile = "\n".join(function_lines(asm, "tf_wtile_1"))
    assert "vpdpbusd" in tile and ("zmm" if lanes == 16 else "ymm") in tile
    assert "{vex}" in tile or lanes == 16  # AVX-VNNI's encoding, not EVEX


@pytest.mark.parametrize(("target_name", "lanes"), [("x86-64-v3", 8), ("x86-64-v4", 16)])
@pytest.mark.parametrize("code", ["i4", "i8", "u8"])
def test_integer_dot_gemv_without_vnni_emits_pmaddubsw(target_name, lanes, code):
    """Without VNNI the dot is `vpmaddubsw` + `vpmaddwd` (8-bit codes by the sign trick:
    `vpsignb` on AVX2), and no vpdpbusd sneaks in."""
    target = named_target(target_name)
    spec = WgemvSpec(choose_decoder(code, target), lanes, 4, 32, 1, True, code == "u8",
                     dot="maddubs")
    asm = emit_assembly(wvnni_ir(spec, target), target)
    tile = "\n".join(function_lines(asm, "tf_wtile_1"))
    assert "vpmaddubsw" in tile and "vpmaddwd" in tile and "vpdpbusd" not in tile
    assert ("zmm" if lanes == 16 else "ymm") in tile
    if code != "i4" and lanes == 8:
        assert "vpsignb" in tile and "vpabsb" in tile
