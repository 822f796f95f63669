"""Row kernels that sweep a row more than once (norms, softmax) prefetch a later row during
the sweep before the last: chosen by the schedule for those kernels only, present in the code,
harmless past the end of the data (a prefetch never faults), and the results still equal
float64 NumPy."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest

from tests.tolerances import assert_close
from tilefold.codegen.backend import get_backend
from tilefold.codegen.kernel import compile_group, lower_group
from tilefold.ir import functional as F
from tilefold.ir import trace
from tilefold.target import host_target

PAGE = mmap.PAGESIZE
PROT_NONE = 0  # POSIX; Python's mmap module does not name it


def _layer_norm(shape):
    w = ("w", "f32", shape[-1:])
    return trace(lambda v, a, c: F.layer_norm(v, a, c, eps=1e-5), ("x", "f32", shape), w,
                 ("b", "f32", shape[-1:]))["main"]


def _np_layer_norm(x, w, b):
    x, w, b = (a.astype(np.float64) for a in (x, w, b))
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b


def test_the_schedule_prefetches_rows_swept_twice_only():
    """layer_norm, rms_norm and a last-axis softmax sweep each row 2-3 times: they prefetch
    along the row axis. An elementwise kernel (one sweep) and a softmax over the first axis
    (the vector runs across rows) do not."""
    x = ("x", "f32", (6, 40))
    swept = {
        "layer_norm": _layer_norm((6, 40)),
        "rms_norm": trace(lambda v, a: F.rms_norm(v, a), x, ("w", "f32", (40,)))["main"],
        "softmax": trace(lambda v: F.softmax(v, axis=-1), ("x", "f32", (2, 3, 40)))["main"],
    }
    for name, group in swept.items():
        kernel, schedule = lower_group(group)
        assert schedule.prefetch_axis == kernel.body[0].axes[-1], name
        assert f"prefetch next {schedule.prefetch_axis}" in str(schedule)
    once = [trace(lambda v: F.exp(v) * 2.0, x)["main"],
            trace(lambda v: F.softmax(v, axis=0), x)["main"]]
    for group in once:
        assert lower_group(group)[1].prefetch_axis is None


def test_prefetches_are_in_the_code():
    group = _layer_norm((64, 512))
    kernel, schedule = lower_group(group)
    backend = get_backend("llvm")
    asm = backend.assembly(kernel, schedule, host_target())
    assert "prefetch" in asm or "prfm" in asm
    plain = backend.assembly(kernel, schedule.__class__(schedule.vector_axis,
                                                       schedule.vector_width, schedule.unroll,
                                                       schedule.parallel_axis), host_target())
    assert "prefetch" not in plain and "prfm" not in plain


@pytest.fixture
def guarded_rows():
    """An f32 [8, 512] array whose last byte ends a page followed by an inaccessible page: the
    last row's prefetch of the "next row" points into the guard page."""
    nbytes = 8 * 512 * 4
    data = -(-nbytes // PAGE) * PAGE
    region = mmap.mmap(-1, data + PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    anchor = ctypes.c_char.from_buffer(region)
    guard = ctypes.c_void_p(ctypes.addressof(anchor) + data)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mprotect(guard, PAGE, PROT_NONE) != 0:
        pytest.fail(f"mprotect failed: errno {ctypes.get_errno()}")
    x = np.frombuffer(region, np.float32, nbytes // 4, data - nbytes).reshape(8, 512)
    yield x
    libc.mprotect(guard, PAGE, mmap.PROT_READ | mmap.PROT_WRITE)


def test_prefetch_past_the_end_of_the_data_is_harmless(guarded_rows):
    rng = np.random.default_rng(3)
    guarded_rows[:] = rng.standard_normal(guarded_rows.shape).astype(np.float32) * 3 + 1
    w, b = (rng.standard_normal(512).astype(np.float32) for _ in range(2))
    run = compile_group(_layer_norm((8, 512)))
    (got,) = run(guarded_rows, w, b)
    assert_close(got, _np_layer_norm(guarded_rows, w, b), dtype="f32", reduced=512)


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (5, 64), (7, 2053), (2, 3, 35)])
def test_prefetching_kernels_match_float64(shape):
    """Full steps and masked tails, one row and several, a strided (transposed-back) input."""
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 4 - 1).astype(np.float32)
    w, b = (rng.standard_normal(shape[-1:]).astype(np.float32) for _ in range(2))
    run = compile_group(_layer_norm(shape))
    assert_close(run(x, w, b)[0], _np_layer_norm(x, w, b), dtype="f32", reduced=shape[-1])
    strided = np.ascontiguousarray(np.swapaxes(x, 0, -1)).swapaxes(0, -1)
    assert_close(run(strided, w, b)[0], _np_layer_norm(x, w, b), dtype="f32",
                 reduced=shape[-1])
