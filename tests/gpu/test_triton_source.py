"""The Triton backend without Triton: what it supports, the GPU schedule it picks, the source
it writes, IEEE products for every f32 dot of the templates (none of this imports Triton)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tilefold.codegen.backend import get_backend
from tilefold.codegen.kernel import lower_group
from tilefold.codegen.kernel.ir import Const, Kernel, Store
from tilefold.codegen.lower.primitives import PRIMITIVES
from tilefold.codegen.triton.attention import AttentionSpec, emit_attention
from tilefold.codegen.triton.gemm import GemmSpec, emit_gemm
from tilefold.codegen.triton.math import PRIMITIVE_FORMS
from tilefold.codegen.triton.schedule import GPUSchedule, Launch, choose_gpu_schedule
from tilefold.ir import functional as F
from tilefold.ir import trace
from tilefold.target import gpu_target, host_target

H200 = gpu_target("h200")
TRITON = get_backend("triton")


def _kernel(fn, *params) -> Kernel:
    return lower_group(trace(fn, *params)["main"])[0]


def _softmax() -> Kernel:
    return _kernel(lambda x: F.softmax(x, -1), ("x", "f32", ("n", "m")))


def test_supports_nvidia_gpus_only():
    kernel = _softmax()
    assert TRITON.supports(kernel, H200) is None
    assert TRITON.supports(kernel, gpu_target("sm_80")) is None
    assert "not a GPU target" in TRITON.supports(kernel, host_target())
    assert "NVIDIA GPUs only" in TRITON.supports(kernel, gpu_target("mi300x"))
    assert "not a CPU target" in get_backend("llvm").supports(kernel, H200)


def test_a_primitive_without_a_form_is_refused_by_name():
    kernel = _kernel(lambda x, y: x ** y, ("x", "f32", (4, 5)), ("y", "f32", (4, 5)))
    assert "no form for pow" in TRITON.supports(kernel, H200)


def test_every_other_primitive_has_a_form():
    assert set(PRIMITIVES) - set(PRIMITIVE_FORMS) == {"pow"}


def test_other_dtypes_and_loop_nests_are_refused():
    kernel = _softmax()
    wide = dataclasses.replace(kernel, buffers=tuple(dataclasses.replace(b, dtype="f64")
                                                     for b in kernel.buffers))
    assert "not f64" in TRITON.supports(wide, H200)
    (outer,) = kernel.body
    deep = dataclasses.replace(kernel, body=(dataclasses.replace(
        outer, body=(dataclasses.replace(outer.body[0], body=(outer,)),)),))
    assert "three deep" in TRITON.supports(deep, H200)


def test_the_schedule_is_pinned():
    sched = choose_gpu_schedule(_softmax(), H200)
    assert sched == GPUSchedule(("i0",), ("r1",), True, 2048, 2048, 4)
    assert sched.block_shape(5, 37) == (8, 64)      # whole rows, several a program
    assert sched.block_shape(3, 5000) == (1, 2048)  # long rows in chunks
    assert sched.block_shape(None, None) == (1, 2048)
    ew = _kernel(lambda x: F.exp(x), ("x", "f32", ("n", "m")))
    sched = choose_gpu_schedule(ew, H200)
    # both dims merged into one axis
    assert (sched.row_axes, sched.col_axes, sched.loop_cols) == ((), ("i0_1",), False)
    assert choose_gpu_schedule(ew, gpu_target("mi300x")).tile_elements == 4096  # 64-wide waves


def test_a_sum_over_the_leading_axis_puts_rows_first():
    colsum = _kernel(lambda x: F.sum(x, 0), ("x", "f32", ("n", "m")))
    sched = choose_gpu_schedule(colsum, H200)
    assert (sched.row_axes, sched.col_axes, sched.rows_first) == (("i1",), ("r0",), True)
    assert sched.block_shape(48, 9) == (64, 16)    # lanes along the contiguous rows
    assert sched.block_shape(1000, 3) == (128, 4)
    assert not choose_gpu_schedule(_softmax(), H200).rows_first


def test_source_names_the_kernel_and_masks_every_access():
    text = TRITON.source(_softmax(), None, H200)
    assert "@triton.jit" in text and "def main(" in text
    # one load in the ONE_PASS form, one a pass in the looped form
    one, looped = text.split("    if ONE_PASS:")[1].split("    else:")
    assert one.count("tl.load(") == one.count("mask=tile_mask, other=0)") == 1
    assert looped.count("tl.load(") == looped.count("mask=tile_mask, other=0)") == 3
    assert "while" not in one and one.count("tl.exp2(") == 1  # e^(x - max) once an element
    assert "_tf_max, keep_dims=True)" in text and "def _tf_max" in text
    assert "libdevice" not in text and "def _tf_tanh" not in text  # helpers only when used


def test_one_pass_holds_rows_up_to_a_limit_and_stores_without_rounding_twice():
    sched = choose_gpu_schedule(_softmax(), H200)
    assert sched.launch(8192, 8192) == Launch(1, 8192, 16, True)  # 16 f32 a thread
    assert sched.launch(5, 37) == Launch(8, 64, 4, True)
    assert sched.launch(3, 40000) == Launch(1, 2048, 4, False)  # beyond: chunks in a loop
    bf16 = _kernel(lambda x: F.softmax(x, -1), ("x", "bf16", ("n", "m")))
    text = TRITON.source(bf16, None, H200)
    assert "_tf_round_bf16" not in text  # the bf16 store rounds once, to nearest even


def test_a_constant_store_is_a_tile():
    kernel = _kernel(lambda x: F.exp(x), ("x", "f32", (3, 5)))
    (outer,) = kernel.body
    const = dataclasses.replace(kernel, body=(dataclasses.replace(
        outer, body=(Store("out0", Const(2.5)),)),))
    assert "tl.full([1, 1], 2.5, tl.float32)" in TRITON.source(const, None, H200)


def test_triton_is_not_imported_to_emit(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)  # any import of it would fail
    assert "def main(" in TRITON.source(_softmax(), None, H200)


@pytest.mark.parametrize("name", ["h100", "sm_90", "a100"])
def test_every_nvidia_target_gets_a_schedule(name):
    assert choose_gpu_schedule(_softmax(), gpu_target(name)).num_warps == 4


F32_GEMMS = [GemmSpec("f32", "f32"), GemmSpec("f32", "f32", split="workspace"),
             GemmSpec("f32", "f32", split="atomic"), GemmSpec("f32", "f32", pipelined=False),
             GemmSpec("f32", "i8"), GemmSpec("f32", "u8", zero_point=True),
             GemmSpec("f32", "i4", pipelined=False), GemmSpec("f32", "fp8e4m3"),
             GemmSpec("f32", "f32", tma="kn"), GemmSpec("f32", "f32", tma="nk", pipelined=False)]
NARROW_GEMMS = [GemmSpec("bf16", "bf16"), GemmSpec("f16", "f16", tma="nk"),
                GemmSpec("f16", "i4"), GemmSpec("bf16", "i8", split="workspace"),
                GemmSpec("fp8e4m3", "fp8e4m3")]


def _dots(source: str) -> list[str]:
    return re.findall(r"tl\.dot\([^\n]*", source)


def test_every_dot_on_f32_operands_asks_for_ieee_products():
    """TF32 (Triton's default for f32 dots on NVIDIA GPUs) would keep 10 of an f32 operand's 23
    mantissa bits: every f32 dot of the templates (pointer and TMA, split-K, dequantized
    weights, pipelined and interpreted; both attention products) says input_precision="ieee",
    and no narrower one does (its products are exact in f32 anyway)."""
    ieee = 'input_precision="ieee"'
    for spec in F32_GEMMS:
        dots = _dots(emit_gemm(spec))
        assert dots and all(ieee in d for d in dots), (spec, dots)
    for spec in NARROW_GEMMS:
        dots = _dots(emit_gemm(spec))
        assert dots and not any("input_precision" in d for d in dots), (spec, dots)
    for dtype, pipelined in (("f32", True), ("f32", False), ("bf16", True), ("f16", True)):
        dots = _dots(emit_attention(AttentionSpec(dtype, causal=True, pipelined=pipelined)))
        assert len(dots) == 4  # scores and P V, in the unmasked and the masked key loops
        assert all((ieee in d) == (dtype == "f32") for d in dots), (dtype, dots)
