"""Native methods against the reference interpreter: row programs, the expert softmax, GEMM
epilogues, and the LTO library (whose call must be inlined away)."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.ir import interpret, parse_module
from tilefold.passes import PassManager
from tilefold.runtime import emit_assembly
from tilefold.strategy import METHODS, Problem, context

RNG = np.random.default_rng(7)


def _check(text: str, method: str, *inputs: np.ndarray, rtol: float = 2e-5) -> str:
    """Fuse `text`, build `method`'s candidate for its one group, compare with the oracle."""
    module = parse_module(text)
    want = interpret(module, *inputs)
    PassManager("fusion").run(module)
    (op,) = [o for o in module["main"].ops if o.name == "fused"]
    inputs = tuple(inputs[module["main"].args.index(v)] for v in op.operands)
    problem = Problem.of(op, [a.shape for a in inputs])
    candidates = METHODS[method].propose(problem, context())
    assert not isinstance(candidates, str), candidates
    kernel = candidates[0].build()
    outs = [np.full(t.shape, np.nan, np.float32) for t in problem.out_types()]
    kernel.run(*inputs, *outs, *kernel.scratch_arrays())
    for got, ref in zip(outs, want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * max(1, np.abs(ref).max()))
    return kernel.source


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("n", [7, 16, 100, 128])
def test_expert_softmax_rows_with_tails(n):
    text = f"""func @main(%x: f32[9,{n}]) -> (f32[9,{n}]) {{
      %0 = softmax(%x) : f32[9,{n}]
      return(%0)
    }}"""
    _check(text, "handwritten.softmax", f32(9, n, scale=8))


@pytest.mark.parametrize("n", [517, 512])
def test_expert_softmax_streams_past_the_cache(n):
    """On a host whose L3 is 64 KiB, a 600-row softmax stores around the cache (vmovnt* in
    its code), prefetches rows ahead, splits its rows over two threads (each with its own
    scratch row on its stack), and matches float64 NumPy, also into an output 4 bytes off
    alignment (those stores stay ordinary)."""
    import dataclasses

    from tests.tolerances import assert_close
    from tilefold.codegen.llvm.cpu.softmax import softmax_kernel

    target = dataclasses.replace(context().target, l3_bytes=64 << 10)
    kernel = softmax_kernel(f"tf_softmax_stream{n}", 600, n, target, 2)
    asm = kernel.assembly()
    assert "movntps" in asm and "prefetcht0" in asm
    x = f32(600, n, scale=6)
    want = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    for offset in (0, 1):
        y = np.full(x.size + 16, np.nan, np.float32)
        start = (-y.ctypes.data // 4) % 16 + offset  # 64-byte aligned, then `offset` floats
        out = y[start:start + x.size].reshape(x.shape)
        kernel.function(x, out)
        assert_close(out, want, dtype="f32", reduced=n)


@pytest.mark.parametrize(("ops", "extra"), [
    ("%1 = add(%0, %b) : f32[5,100]\n %2 = gelu(%1) {approximate = \"tanh\"} : f32[5,100]", ""),
    ("%1 = add(%0, %r) : f32[5,100]\n %2 = layer_norm(%1, %w, %b) : f32[5,100]", ""),
    ("%1 = mul(%0, %s) : f32[5,100]\n %2 = log_softmax(%1) : f32[5,100]", ""),
    ("%1 = silu(%0) : f32[5,100]\n %2 = rms_norm(%1, %w) : f32[5,100]", ""),
])
def test_gemm_epilogues_as_row_programs(ops, extra):
    text = f"""func @main(%x: f32[5,24], %wt: f32[100,24], %b: f32[100], %r: f32[5,100],
                       %w: f32[100], %s: f32[]) -> (f32[5,100]) {{
      %t = transpose(%wt) {{perm = [1, 0]}} : f32[24,100]
      %0 = matmul(%x, %t) : f32[5,100]
      {ops}
      return(%2)
    }}"""
    _check(text, "blocks.gemm", f32(5, 24), f32(100, 24), f32(100), f32(5, 100), f32(100),
           np.array(0.5, np.float32), rtol=1e-4)


def test_batched_scores_softmax_epilogue():
    text = """func @main(%q: f32[3,16,8], %k: f32[3,16,8]) -> (f32[3,16,16]) {
      %0 = matmul(%q, %k) {transpose_b = true} : f32[3,16,16]
      %1 = softmax(%0) : f32[3,16,16]
      return(%1)
    }"""
    _check(text, "blocks.gemm", f32(3, 16, 8), f32(3, 16, 8), rtol=1e-4)


def test_lto_row_mean_and_gemv_inline_the_library():
    text = """func @main(%x: f32[33,77]) -> (f32[33]) {
      %0 = reduce_mean(%x) {axes = [1]} : f32[33]
      return(%0)
    }"""
    source = _check(text, "lto.rowlib", f32(33, 77), rtol=1e-5)
    assert "define internal float @tf_lib_row_sum" in source  # linked in...
    asm = emit_assembly(source, context().target, opt_level=2)
    assert "tf_lib_" not in asm and "call" not in asm.split("tf_lto_mean")[1].split(".Lfunc_end")[0]
    gemv = """func @main(%a: f32[20,300], %v: f32[300]) -> (f32[20]) {
      %0 = matmul(%a, %v) : f32[20]
      return(%0)
    }"""
    _check(gemv, "lto.rowlib", f32(20, 300), f32(300), rtol=1e-4)


def test_extern_torch_runs_on_one_thread_and_restores_the_count(monkeypatch):
    """PyTorch's OpenMP workers would spin beside tilefold's after the op (and slow the next
    native kernel), so extern.torch runs its ops on one thread and restores the setting."""
    torch = pytest.importorskip("torch")
    seen = []
    matmul = torch.matmul

    def spy(a, b):
        seen.append(torch.get_num_threads())
        return matmul(a, b)

    monkeypatch.setattr(torch, "matmul", spy)
    torch.set_num_threads(2)
    text = """func @main(%x: f32[6,20], %w: f32[20,9]) -> (f32[6,9]) {
      %0 = matmul(%x, %w) : f32[6,9]
      return(%0)
    }"""
    _check(text, "extern.torch", f32(6, 20), f32(20, 9))
    assert seen == [1] and torch.get_num_threads() == 2


def test_extern_numpy_runs_blas_on_one_thread(monkeypatch):
    """OpenBLAS's threads spin after a threaded call and slowed the next native kernel 2.5x,
    so extern.numpy's matmul runs with one BLAS thread, and the limit is lifted after."""
    from threadpoolctl import threadpool_info

    from tilefold.strategy.methods import extern

    def blas_threads():  # NumPy's BLAS (SciPy may have loaded another one)
        return [lib["num_threads"] for lib in threadpool_info()
                if lib["user_api"] == "blas" and "numpy" in lib["filepath"]]

    seen = []

    def spy(a, b, attrs):
        seen.append(blas_threads())
        return np.matmul(a, b)

    monkeypatch.setitem(extern.NUMPY, "matmul", spy)
    before = blas_threads()
    text = """func @main(%x: f32[6,20], %w: f32[20,9]) -> (f32[6,9]) {
      %0 = matmul(%x, %w) : f32[6,9]
      return(%0)
    }"""
    _check(text, "extern.numpy", f32(6, 20), f32(20, 9))
    assert before and seen == [[1] * len(before)] and blas_threads() == before
