"""Every memory-bound kernel family the Triton backend emits, run by Triton's interpreter on CPU
torch tensors (or compiled on CUDA ones: `placement.py`) at small odd shapes, against float64
NumPy.

Triton's interpreter computes bf16 wrongly, so bf16 buffers are widened to f32 for the launch
while interpreting (`codegen/triton/launch.py`): there the bf16 case checks the widening and the
kernel's bf16 rounding; on the device, Triton's bf16 loads and stores."""

from __future__ import annotations

import dataclasses
import math
import re

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")
torch = pytest.importorskip("torch")

from tests.gpu.placement import DEVICE, compiled_kernels, f64, host, tensor  # noqa: E402
from tests.tolerances import assert_close, tolerance  # noqa: E402
from tilefold.codegen.backend import get_backend  # noqa: E402
from tilefold.codegen.kernel import lower_group  # noqa: E402
from tilefold.codegen.triton.group import TritonGroup  # noqa: E402
from tilefold.codegen.triton.schedule import GPUSchedule, choose_gpu_schedule  # noqa: E402
from tilefold.ir import functional as F  # noqa: E402
from tilefold.ir import trace  # noqa: E402
from tilefold.target import gpu_target  # noqa: E402

H200 = gpu_target("h200")
RNG = np.random.default_rng(16)
erf = np.vectorize(math.erf)


def _run(fn, params, *arrays):
    group = TritonGroup(trace(fn, *params)["main"], H200)
    tensors = [a if isinstance(a, torch.Tensor) else tensor(a) for a in arrays]
    return [host(o) for o in group(*tensors)]


def _normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_elementwise_chain_with_broadcast_and_strides():
    base = _normal(37, 7)
    x = tensor(base).t()  # (7, 37), column-major: the tile walks strided memory
    b = _normal(37)
    (got,) = _run(lambda x, b: F.exp(x - b) * F.sigmoid(x) + F.tanh(x) * F.gelu(x - 1.0),
                  (("x", "f32", ("n", "m")), ("b", "f32", ("m",))), x, b)
    x64, b64 = base.T.astype(np.float64), b.astype(np.float64)
    want = np.exp(x64 - b64) / (1 + np.exp(-x64)) + np.tanh(x64) * (
        0.5 * (x64 - 1) * (1 + erf((x64 - 1) / np.sqrt(2))))
    assert_close(got, want, dtype="f32", scale=np.abs(want))


def test_max_min_keep_nan_and_compare_gives_bools():
    x, y = _normal(5, 9), _normal(5, 9)
    x[1, 2], y[3, 4] = np.nan, np.nan
    hi, lo, gt = _run(lambda x, y: (F.maximum(x, y), F.minimum(F.relu(x), y), F.greater(x, y)),
                      (("x", "f32", (5, 9)), ("y", "f32", (5, 9))), x, y)
    np.testing.assert_array_equal(hi, np.maximum(x, y))  # NaN from either side
    np.testing.assert_array_equal(lo, np.minimum(np.where(x < 0, 0, x), y))
    assert gt.dtype == np.bool_
    np.testing.assert_array_equal(gt, x > y)


def test_tanh_keeps_its_digits_near_zero():
    x = np.concatenate([np.geomspace(1e-6, 20, 60), -np.geomspace(1e-6, 20, 60)]).astype(
        np.float32)
    (got,) = _run(F.tanh, (("x", "f32", (120,)),), x)
    assert_close(got, np.tanh(x.astype(np.float64)), dtype="f32")


@pytest.mark.parametrize("axis", [0, 1])
def test_reduce_sum_along_each_axis(axis):
    x = _normal(9, 13)
    (got,) = _run(lambda x: F.sum(x, axis), (("x", "f32", (9, 13)),), x)
    assert_close(got, x.astype(np.float64).sum(axis), dtype="f32", reduced=x.shape[axis])


def test_reduce_max_over_two_separate_axes_and_a_full_mean():
    x = _normal(3, 5, 7)
    (got,) = _run(lambda x: F.max(x, (0, 2)), (("x", "f32", (3, 5, 7)),), x)
    np.testing.assert_array_equal(got, x.max((0, 2)))
    (got,) = _run(lambda x: F.mean(x), (("x", "f32", (3, 5, 7)),), x)
    assert got.shape == ()
    assert_close(got, x.astype(np.float64).mean(), dtype="f32", reduced=x.size)


def _softmax64(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax(axis):
    x = _normal(11, 29) * 3
    (got,) = _run(lambda x: F.softmax(x, axis), (("x", "f32", (11, 29)),), x)
    assert_close(got, _softmax64(x.astype(np.float64), axis), dtype="f32",
                 reduced=x.shape[axis])


def test_log_softmax():
    x = _normal(6, 45) * 3
    (got,) = _run(lambda x: F.log_softmax(x), (("x", "f32", (6, 45)),), x)
    x64 = x.astype(np.float64)
    want = x64 - x64.max(-1, keepdims=True)
    want -= np.log(np.exp(want).sum(-1, keepdims=True))
    assert_close(got, want, dtype="f32", reduced=45, scale=np.abs(want))


def test_layer_norm_and_rms_norm():
    x, w, b = _normal(7, 33) + 2, _normal(33), _normal(33)
    params = (("x", "f32", (7, 33)), ("w", "f32", (33,)), ("b", "f32", (33,)))
    (ln,) = _run(lambda x, w, b: F.layer_norm(x, w, b, eps=1e-5), params, x, w, b)
    x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)
    d = x64 - x64.mean(-1, keepdims=True)
    want = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * w64 + b64
    assert_close(ln, want, dtype="f32", reduced=33, scale=np.abs(want))
    (rms,) = _run(lambda x, w: F.rms_norm(x, w, eps=1e-6), params[:2], x, w)
    want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w64
    assert_close(rms, want, dtype="f32", reduced=33, scale=np.abs(want))


def test_bf16_softmax():
    x = (_normal(5, 19) * 2).astype(ml_dtypes.bfloat16)
    xt = tensor(x.astype(np.float32)).to(torch.bfloat16)
    (got,) = _run(lambda x: F.softmax(x), (("x", "bf16", (5, 19)),), xt)
    assert_close(got, _softmax64(x.astype(np.float64), -1), dtype="bf16", reduced=19)


def test_f16_elementwise():
    x = _normal(3, 17).astype(np.float16)
    (got,) = _run(lambda x: F.silu(x) * 3.0, (("x", "f16", (3, 17)),), x)
    x64 = x.astype(np.float64)
    assert got.dtype == np.float16
    assert_close(got, 3 * x64 / (1 + np.exp(-x64)), dtype="f16")


def test_rows_longer_than_a_chunk_take_several_masked_chunks():
    kernel, _ = lower_group(trace(lambda x: F.softmax(x), ("x", "f32", ("n", "m")))["main"])
    sched = GPUSchedule(("i0",), ("r1",), True, tile_elements=32, max_block_cols=16,
                        num_warps=1, one_pass_cols=16)
    launch = get_backend("triton").compile(kernel, sched, H200).entry
    x = _normal(5, 37) * 3
    out = torch.empty(5, 37, device=DEVICE)
    launch([tensor(x), out], [5, 37], [[37, 1], [37, 1]])  # 3 chunks, the last masked
    assert_close(host(out), _softmax64(x.astype(np.float64), -1), dtype="f32", reduced=37)


@pytest.mark.parametrize("one_pass_cols", [0, 64], ids=["looped", "one-pass"])
def test_layer_norm_in_chunks_and_in_one_pass(one_pass_cols):
    x, w, b = _normal(5, 37) + 2, _normal(37), _normal(37)
    kernel, _ = lower_group(trace(lambda x, w, b: F.layer_norm(x, w, b, eps=1e-5),
                                  ("x", "f32", ("n", "m")), ("w", "f32", ("m",)),
                                  ("b", "f32", ("m",)))["main"])
    sched = dataclasses.replace(choose_gpu_schedule(kernel, H200), max_block_cols=16,
                                one_pass_cols=one_pass_cols)
    launch = get_backend("triton").compile(kernel, sched, H200).entry
    out = torch.empty(5, 37, device=DEVICE)
    launch([*map(tensor, (x, w, b)), out], [5, 37], [[37, 1], [1], [1], [37, 1]])
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(-1, keepdims=True)
    want = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * w + b
    assert_close(host(out), want, dtype="f32", reduced=37, scale=np.abs(want))


def test_bool_inputs_and_constant_buffers():
    cond = RNG.standard_normal((4, 23)) > 0
    x, y = _normal(4, 23), _normal(23)
    scale = np.linspace(-2, 2, 23).astype(np.float32)  # not a splat: a hidden constant buffer
    (got,) = _run(lambda c, x, y: F.where(c, x * scale, y),
                  (("c", "bool", (4, 23)), ("x", "f32", (4, 23)), ("y", "f32", (23,))),
                  cond, x, y)
    want = np.where(cond, x.astype(np.float64) * scale, y)
    assert_close(got, want, dtype="f32")


def test_empty_rows_and_empty_reductions():
    (got,) = _run(lambda x: F.softmax(x), (("x", "f32", ("n", 5)),), _normal(0, 5))
    assert got.shape == (0, 5)
    total, top = _run(lambda x: (F.sum(x, 1), F.max(x, 1)), (("x", "f32", (3, "m")),),
                      _normal(3, 0))
    np.testing.assert_array_equal(total, np.zeros(3))
    np.testing.assert_array_equal(top, np.full(3, -np.inf))


def test_exp_over_its_whole_range():
    x = np.concatenate([np.linspace(-110, 89, 97), [0.0, -0.0, 88.72, -103.3, np.inf, -np.inf,
                                                    np.nan]]).astype(np.float32)
    (got,) = _run(F.exp, (("x", "f32", (x.size,)),), x)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64))
    finite = np.isfinite(want) & (want < float(np.finfo(np.float32).max))
    assert_close(got[finite], want[finite], dtype="f32", scale=0.0)
    normal = finite & (want > float(np.finfo(np.float32).tiny))  # relative error there too
    np.testing.assert_allclose(got[normal], want[normal], rtol=tolerance("f32")["rtol"], atol=0)
    assert np.isposinf(got[~finite & (x > 0)]).all() and np.isnan(got[-1])


def test_three_dims_permuted_rows_flattened_over_two_axes():
    base = _normal(7, 3, 5) * 2
    x = tensor(base).permute(1, 2, 0)  # (3, 5, 7), no axis contiguous in order
    s = _normal(1, 5, 1)
    params = (("x", "f32", (3, 5, 7)), ("s", "f32", (1, 5, 1)))
    group = TritonGroup(trace(lambda x, s: F.softmax(x * s, 1), *params)["main"], H200)
    _, schedule = group.kernel_for(x, tensor(s))
    assert len(schedule.row_axes) == 2 and not schedule.rows_first
    (got,) = _run(lambda x, s: F.softmax(x * s, 1), params, x, s)
    x64 = base.transpose(1, 2, 0).astype(np.float64) * s
    assert_close(got, _softmax64(x64, 1), dtype="f32", reduced=5)
    (got,) = _run(lambda x, s: F.exp(x) - s, params, x, s)
    assert_close(got, np.exp(base.transpose(1, 2, 0).astype(np.float64)) - s, dtype="f32",
                 scale=np.exp(np.abs(x64)))


def test_generated_code_calls_no_jit_function_of_triton_s_library():
    """Those are interpreted only if Triton was imported under TRITON_INTERPRET=1; the rest
    of a test suite (PyTorch) may import it first without."""
    import triton.language.standard as standard
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    jitted = [n for n in dir(standard)
              if isinstance(getattr(standard, n), JITFunction | InterpretedFunction)]
    assert "sum" in jitted and "cdiv" in jitted
    backend = get_backend("triton")
    families = [lambda x: F.softmax(F.tanh(x)), lambda x: F.log_softmax(F.gelu(x)),
                lambda x: F.sum(F.silu(x), 0), lambda x: F.exp(x) * F.sigmoid(x),
                lambda x: F.rms_norm(x, np.ones(9, np.float32)), lambda x: F.min(x, 1)]
    for fn in families:
        kernel, _ = lower_group(trace(fn, ("x", "f32", ("n", 9)))["main"])
        text = backend.source(kernel, None, H200)
        assert not [n for n in jitted if f"tl.{n}(" in text], text


@pytest.mark.parametrize("dtype, np_dtype", [("bf16", ml_dtypes.bfloat16), ("f16", np.float16)])
def test_casts_round_to_nearest_even(dtype, np_dtype):
    ties = [1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 1 + 2.0**-11, 1 + 3 * 2.0**-11]
    special = [np.inf, -np.inf, np.nan, 3.4e38, 65519.0, 65520.0, 0.0, -0.0, 1e-30]
    x = np.concatenate([_normal(40) * 100, ties, special]).astype(np.float32)
    with np.errstate(over="ignore"):  # 65520 and up overflow f16, as they should
        want = x.astype(np_dtype).astype(np.float32)
    (got,) = _run(lambda x: F.cast(x, dtype), (("x", "f32", (x.size,)),), x)
    np.testing.assert_array_equal(got.astype(np.float32), want)


@pytest.mark.device_only("checks the binary Triton compiled for the CUDA device")
def test_bf16_softmax_ran_compiled_for_the_device():
    from triton.runtime.jit import JITFunction

    kernel, _ = lower_group(trace(lambda x: F.softmax(x), ("x", "bf16", ("n", "m")))["main"])
    launch = get_backend("triton").compile(kernel, choose_gpu_schedule(kernel, H200), H200).entry
    x = tensor(_normal(6, 300) * 3).to(torch.bfloat16)
    out = torch.empty_like(x)
    launch([x, out], [6, 300], [[300, 1], [300, 1]])
    assert_close(f64(out), _softmax64(f64(x), -1), dtype="bf16", reduced=300)
    assert isinstance(launch.fn, JITFunction)  # not the interpreter's InterpretedFunction
    binaries = compiled_kernels(launch.fn)
    major, minor = torch.cuda.get_device_capability()
    assert binaries and all(k.metadata.target.arch == 10 * major + minor for k in binaries)
    assert re.search(r"cvt\.rn\.bf16", binaries[0].asm["ptx"])  # stored as bf16, not widened
