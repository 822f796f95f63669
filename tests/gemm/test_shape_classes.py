"""Shape classes: A with contiguous rows is read in place ("rows"), by tall tiles when C is at
most NR columns wide ("narrow"); other A layouts are packed ("general")."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.gemm.reference import check_matmul
from tilefold.codegen.llvm.gemm.module import CODEGEN_OPTIONS, gemm_ir, gemm_module
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.gemm.registry import select_microkernel
from tilefold.errors import UnsupportedError
from tilefold.target import host_target, named_target


@pytest.mark.parametrize("target_name, general, rows, narrow", [
    ("x86-64-v4", "avx512_8x48", "avx512_8x48_rows", "avx512_28x16"),
    ("x86-64-v3", "avx2_6x16", "avx2_6x16_rows", "avx2_12x8"),
    ("neoverse-v1", "neon_8x12", "neon_8x12", "neon_8x12"),
    ("generic", "generic_4x8", "generic_4x8", "generic_4x8"),
])
def test_selection_by_shape_class(target_name, general, rows, narrow):
    target = named_target(target_name)
    assert select_microkernel(target).name == general
    assert select_microkernel(target, shape_class="rows").name == rows
    assert select_microkernel(target, shape_class="narrow").name == narrow


def test_unknown_shape_class_is_refused():
    with pytest.raises(UnsupportedError, match="shape class"):
        select_microkernel(named_target("generic"), shape_class="wide")


def _a(rng, m, k, layout):
    if layout == "rows_padded":  # row stride > K, columns contiguous
        return rng.standard_normal((m, k + 5), dtype=np.float32)[:, 2:k + 2]
    base = rng.standard_normal((m, k), dtype=np.float32)
    return base[::-1] if layout == "neg_rows" else base


@pytest.mark.parametrize("isa", [None, "x86-64-v3"])
@pytest.mark.parametrize("m, n, k", [(2, 16, 5), (28, 16, 256), (29, 7, 300), (57, 1, 33),
                                     (300, 16, 1000), (95, 12, 129), (8192 // 16, 9, 64)])
@pytest.mark.parametrize("layout", ["c", "rows_padded", "neg_rows"])
@pytest.mark.parametrize("threads", [1, 2])
def test_narrow_products(isa, m, n, k, layout, threads):
    module = gemm_module(host_target(isa=isa) if isa else None)
    narrow = select_microkernel(module.target, shape_class="narrow")
    rng = np.random.default_rng(m * n + k)
    a = _a(rng, m, k, layout)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.full((m, n), np.nan, np.float32)
    plan = make_plan(module, a, b, c, 0, threads)
    if 1 < n <= narrow.nr:
        assert plan.kernel is narrow
    plan(a, b, c)
    check_matmul(c, a, b)


def _reads_rows_in_place(module, n: int, prepacked: bool = False):
    """The kernel a row-major A of an N-column product gets: "narrow" up to its NR (16 columns
    on AVX-512) unless B is pre-packed in other panels, else "rows" up to its `max_n` (a
    "rows" kernel of any width only for B packed per call)."""
    narrow = select_microkernel(module.target, shape_class="narrow")
    same_panels = (narrow.nr, narrow.lanes) == (module.kernel.nr, module.kernel.lanes)
    if narrow.shape_class == "narrow" and n <= narrow.nr and (same_panels or not prepacked):
        return narrow
    rows = select_microkernel(module.target, shape_class="rows")
    if rows.max_n is None:
        return module.kernel if prepacked else rows
    return rows if n <= rows.max_n else module.kernel


@pytest.mark.parametrize("isa", [None, "x86-64-v3"])
@pytest.mark.parametrize("m, n, k", [(8, 48, 1), (9, 49, 130), (64, 100, 300), (130, 96, 1000),
                                     (203, 257, 64), (301, 16, 257), (37, 32, 100), (97, 33, 64),
                                     (2048, 24, 96)])
@pytest.mark.parametrize("layout", ["c", "rows_padded", "neg_rows"])
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_products(isa, m, n, k, layout, threads):
    module = gemm_module(host_target(isa=isa) if isa else None)
    rng = np.random.default_rng(m + n * k)
    a = _a(rng, m, k, layout)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.full((m, n), np.nan, np.float32)
    plan = make_plan(module, a, b, c, 0, threads)
    assert plan.kernel is _reads_rows_in_place(module, n)
    plan(a, b, c)
    check_matmul(c, a, b)


@pytest.mark.parametrize("n", [130, 12])
def test_prepacked_b_goes_to_the_kernel_its_panels_and_width_pick(n):
    """When C is narrow the narrow kernel's panels differ: a rows kernel limited to narrow C
    reads A in place; one for any width gives way to the general kernel packing A."""
    module = gemm_module()
    rng = np.random.default_rng(3)
    a = rng.standard_normal((37, 300), dtype=np.float32)
    b = rng.standard_normal((300, n), dtype=np.float32)
    packed = PackedMatrix(b, module)
    c = np.full((37, n), np.nan, np.float32)
    plan = make_plan(module, a, packed, c, 0, 1)
    assert plan.kernel is _reads_rows_in_place(module, n, prepacked=True)
    plan(a, packed.data, c)
    check_matmul(c, a, b)


def test_transposed_a_keeps_the_general_kernel():
    """A with strided rows cannot be read in place: the general kernel packs it."""
    module = gemm_module()
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 40), dtype=np.float32).T
    b = rng.standard_normal((64, 16), dtype=np.float32)
    c = np.empty((40, 16), np.float32)
    plan = make_plan(module, a, b, c, 0, 1)
    assert plan.kernel is module.kernel
    plan(a, b, c)
    check_matmul(c, a, b)


@pytest.mark.parametrize("shape_class", ["rows", "narrow"])
def test_in_place_avx512_tiles_keep_vectors_in_registers(shape_class):
    """Accumulators and B vectors stay in zmm registers with A broadcast from its rows in
    place (a `vbroadcastss` or a `{1to16}` FMA operand), and the rows' addresses in general
    registers: no stack traffic in the k loop, compiled as the module is."""
    from tilefold.runtime import emit_assembly

    target = named_target("x86-64-v4")
    kernel = select_microkernel(target, shape_class=shape_class)
    asm = emit_assembly(gemm_ir(target, kernel), target, **CODEGEN_OPTIONS)
    body = asm[asm.index(f"{kernel.spec(kernel.mr, kernel.nv).name}:"):]
    body = body[:body.index(".Lfunc_end")]
    loop = max(re.split(r"\n\.?L\w+:", body), key=lambda blk: blk.count("vfmadd"))
    fmas = re.findall(r"\bvfmadd\w*\s+([^\n]*)", loop)
    assert len(fmas) >= kernel.mr * kernel.nv * kernel.unroll
    broadcasts = sum("{1to16}" in ops for ops in fmas) + loop.count("vbroadcastss")
    assert broadcasts >= kernel.mr * kernel.unroll
    assert not re.search(r"\(%rsp\)", loop), loop
