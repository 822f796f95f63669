"""`tilefold.compile`: numerics against the interpreter on random graphs, buffer reuse, call
overhead, and a tuned graph reloaded in a new process without re-tuning or recompiling."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tilefold
from tests.tolerances import tolerance
from tilefold.compiler import compile
from tilefold.ir import Builder, interpret, parse_module
from tilefold.ir import functional as F

MLP = """func @main(%x: f32[?b,16], %w1: f32[16,40], %b1: f32[40], %w2: f32[40,16],
                  %b2: f32[16]) -> (f32[?b,16]) {
  %0 = matmul(%x, %w1) : f32[?b,40]
  %1 = add(%0, %b1) : f32[?b,40]
  %2 = gelu(%1) : f32[?b,40]
  %3 = matmul(%2, %w2) : f32[?b,16]
  %4 = add(%3, %b2) : f32[?b,16]
  %5 = add(%4, %x) : f32[?b,16]
  %6 = reduce_mean(%5) {axes = [1], keepdims = true} : f32[?b,1]
  %7 = sub(%5, %6) : f32[?b,16]
  %8 = softmax(%7) : f32[?b,16]
  return(%8)
}"""

UNARY = ["relu", "exp", "tanh", "sigmoid", "gelu", "neg", "silu"]
BINARY = ["add", "sub", "mul", "max"]
ROWWISE = ["softmax", "log_softmax", "reduce_max", "reduce_sum"]


def _inputs(module, seed=0, **sizes):
    rng = np.random.default_rng(seed)
    shapes = [tuple(sizes.get(getattr(d, "name", None), d) for d in a.type.shape)
              for a in module["main"].args]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_in_place_compiles_the_module_itself_and_a_copy_leaves_it_alone():
    """`in_place=True` runs the passes on the caller's module (fused afterwards), the default on
    a copy (the module prints as it was); both give the interpreter's answer."""
    from tilefold.ir import print_module

    reference = parse_module(MLP)
    xs = _inputs(reference, 3, b=7)
    want = interpret(reference, *xs)[0]
    module = parse_module(MLP)
    _close(compile(module)(*xs)[0], want)
    assert print_module(module) == print_module(reference)
    _close(compile(module, in_place=True)(*xs)[0], want)
    assert "fused" in print_module(module) and "fused" not in print_module(reference)


def test_mlp_matches_interpreter_and_reuses_plans():
    module = parse_module(MLP)
    graph = tilefold.compile(module) if hasattr(tilefold, "compile") else compile(module)
    for batch in (1, 5, 33):
        xs = _inputs(module, batch, b=batch)
        _close(graph(*xs)[0], interpret(module, *xs)[0])
    decisions = graph.decisions((5, 16), (16, 40), (40,), (40, 16), (16,))
    assert all(d.winner.family != "extern" for d in decisions), [d.winner for d in decisions]


@st.composite
def graphs(draw):
    """Random chains of matmuls, elementwise ops and row ops over [rows, n] tensors."""
    rows, n = draw(st.integers(1, 9)), draw(st.integers(2, 40))
    lines, last, args = [], "%x", [f"%x: f32[{rows},{n}]"]
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "row", "matmul"]))
        if kind == "unary":
            lines.append(f"%v{i} = {draw(st.sampled_from(UNARY))}({last}) : f32[{rows},{n}]")
        elif kind == "binary":
            args.append(f"%a{i}: f32[{draw(st.sampled_from([f'{rows},{n}', str(n)]))}]")
            op = draw(st.sampled_from(BINARY))
            lines.append(f"%v{i} = {op}({last}, %a{i}) : f32[{rows},{n}]")
        elif kind == "row":
            op = draw(st.sampled_from(ROWWISE))
            if op.startswith("reduce"):
                lines.append(f"%r{i} = {op}({last}) {{axes = [1], keepdims = true}} : "
                             f"f32[{rows},1]")
                lines.append(f"%v{i} = sub({last}, %r{i}) : f32[{rows},{n}]")
            else:
                lines.append(f"%v{i} = {op}({last}) : f32[{rows},{n}]")
        else:
            args.append(f"%w{i}: f32[{n},{n}]")
            lines.append(f"%v{i} = matmul({last}, %w{i}) : f32[{rows},{n}]")
        last = f"%v{i}"
    body = "\n  ".join(lines)
    return f"func @main({', '.join(args)}) -> (f32[{rows},{n}]) {{\n  {body}\n  return({last})\n}}"


@settings(max_examples=25)
@given(graphs())
def test_random_graphs_match_interpreter(text):
    module = parse_module(text)
    xs = [x * 0.5 for x in _inputs(module)]
    _close(compile(module)(*xs)[0], interpret(module, *xs)[0])


def test_layout_ops_are_views_and_intermediates_share_buffers():
    text = """func @main(%x: f32[64,64]) -> (f32[64,64]) {
      %0 = exp(%x) : f32[64,64]
      %1 = reshape(%0) {shape = [64,64]} : f32[64,64]
      %2 = transpose(%1) {perm = [1, 0]} : f32[64,64]
      %3 = relu(%2) : f32[64,64]
      %4 = transpose(%3) {perm = [1, 0]} : f32[64,64]
      %5 = tanh(%4) : f32[64,64]
      %6 = transpose(%5) {perm = [1, 0]} : f32[64,64]
      %7 = sigmoid(%6) : f32[64,64]
      return(%7)
    }"""
    module = parse_module(text)
    graph = compile(module)
    x = _inputs(module)[0]
    for _ in range(2):  # the second call reuses the planned buffers and views
        _close(graph(x)[0], interpret(module, x)[0])
    plan = next(iter(graph._plans.values()))
    assert len(plan.steps) == 4  # one per kernel: no step for the reshape and transposes
    starts = {a.__array_interface__["data"][0] for i, a in enumerate(plan.env)
              if isinstance(a, np.ndarray) and i not in plan.input_slots}
    assert len(starts) == 2  # exp's memory is free again once relu has read it
    assert plan.nbytes == 2 * 64 * 64 * 4


def test_results_are_fresh_lists_even_for_inputs_and_views():
    text = """func @main(%x: f32[4,6]) -> (f32[4,6], f32[6,4], f32[4,6]) {
      %0 = exp(%x) : f32[4,6]
      %1 = transpose(%0) {perm = [1, 0]} : f32[6,4]
      return(%x, %1, %0)
    }"""
    graph = compile(parse_module(text))
    x = _inputs(parse_module(text))[0]
    first = graph(x)
    assert isinstance(first, list) and len(first) == 3
    np.testing.assert_array_equal(first[0], x)
    assert first[0] is not x and not np.shares_memory(first[1], first[2])
    kept = [a.copy() for a in first]
    graph(x * 2)
    for a, b in zip(first, kept, strict=True):
        np.testing.assert_array_equal(a, b)  # a later call does not overwrite earlier results


@pytest.mark.timing
def test_kernel_launch_overhead_is_small():
    text = """func @main(%x: f32[8,16], %w: f32[16,16]) -> (f32[8,16]) {
      %0 = matmul(%x, %w) : f32[8,16]
      %1 = softmax(%0) : f32[8,16]
      %2 = exp(%1) : f32[8,16]
      %3 = softmax(%2) : f32[8,16]
      return(%3)
    }"""
    module = parse_module(text)
    graph = compile(module)
    xs = _inputs(module)
    graph(*xs)
    launches = 2 + len(graph.decisions((8, 16), (16, 16))) - 1
    best = min(_timed(graph, xs) for _ in range(5))
    per_launch_us = best / launches * 1e6
    assert per_launch_us < 10, f"{per_launch_us:.1f} us per kernel launch"


def _timed(graph, xs, n=200):
    start = time.perf_counter()
    for _ in range(n):
        graph(*xs)
    return (time.perf_counter() - start) / n


_RELOAD = """
import sys, numpy as np
from llvmlite import ir
built = []
to_text = ir.Module.__str__
ir.Module.__str__ = lambda self: built.append(self.name) or to_text(self)
from tilefold.compiler import compile
from tilefold.ir import parse_module
from tilefold.runtime import codegen_runs
from tilefold.strategy import select
module = parse_module(open(sys.argv[1]).read())
graph = compile(module)
rng = np.random.default_rng(0)
xs = [rng.standard_normal([4 if getattr(d, "name", None) == "b" else d for d in a.type.shape])
      .astype(np.float32) for a in module["main"].args]
graph(*xs)
print(codegen_runs(), select.TUNED, len(built))
"""


def test_tuned_graph_reloads_without_tuning_llvm_or_building_ir(tmp_path):
    source = tmp_path / "mlp.tfir"
    source.write_text(MLP)
    # 6 s: the GEMM blocking's share (3 s) is under autotune.LAZY_MIN_S, so only groups are tuned
    env = {**os.environ, "TILEFOLD_CACHE_DIR": str(tmp_path / "cache"), "TILEFOLD_TUNE": "6"}
    src = str(Path(tilefold.__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])

    def run():
        out = subprocess.run([sys.executable, "-c", _RELOAD, str(source)], env=env, check=True,
                             capture_output=True, text=True, timeout=120)
        return [int(x) for x in out.stdout.split()]

    compiles, tuned, built = run()
    assert compiles > 0 and tuned > 0 and built > 0
    assert run() == [0, 0, 0]  # a warm process loads objects by generator fingerprint


def test_strict_plans_poison_fresh_buffers():
    """Strict mode hands kernels NaN-filled outputs and intermediates, so a kernel that wrote
    nothing cannot pass on memory that happened to hold the answer."""
    b = Builder("main")
    x = b.arg("x", "f32", (4, 8))
    module = b.build(F.relu(F.exp(x) * 2.0) + x)
    graph = compile(module, strict=True)
    plan = graph.plan_for((4, 8))
    assert plan.poisoned
    plan.steps[:] = [(lambda *arrays: None, slots) for _, slots in plan.steps]
    (got,) = graph(np.ones((4, 8), np.float32))
    assert np.isnan(got).all()
    assert not compile(module, strict=False).plan_for((4, 8)).poisoned


def test_plans_are_kept_within_a_byte_budget(monkeypatch):
    """Plans for many sizes of a symbolic dim stay cached (no new plan per call when a workload
    cycles through them) until their buffers pass PLAN_BYTES; the newest is always kept, and a
    size planned again still computes right."""
    from tilefold import compiler

    module = parse_module(MLP)
    graph = tilefold.compile(module)
    sizes = [3, 9, 17, 40, 64]
    for batch in sizes:
        graph(*_inputs(module, batch, b=batch))
    assert len(graph._plans) == len(sizes)  # all of them: far below either limit
    held = [p.nbytes for p in graph._plans.values()]
    assert held == sorted(held) and held[0] > 0  # intermediates grow with the batch
    monkeypatch.setattr(compiler, "PLAN_BYTES", held[-1] + held[-2])
    xs = _inputs(module, 1, b=5)
    _close(graph(*xs)[0], interpret(module, *xs)[0])
    kept = list(graph._plans.values())
    assert sum(p.nbytes for p in kept) <= held[-1] + held[-2] and len(kept) < len(sizes)
    monkeypatch.setattr(compiler, "PLAN_BYTES", 0)  # a new size: only its plan stays
    xs = _inputs(module, 2, b=7)
    _close(graph(*xs)[0], interpret(module, *xs)[0])
    assert len(graph._plans) == 1


def test_a_recording_counts_towards_its_plans_bytes():
    """A plan replaying its kernels also holds the recording's output buffers (`Plan.held`)."""
    module = parse_module(MLP)
    graph = tilefold.compile(module)
    xs = _inputs(module, 0, b=6)
    for _ in range(3):  # the second call records, the third replays
        _close(graph(*xs)[0], interpret(module, *xs)[0])
    (plan,) = graph._plans.values()
    assert plan.replay is not None
    outputs = sum(np.empty(shape, dtype).nbytes for _, shape, dtype in plan.output_slots)
    assert plan.held == plan.nbytes + outputs > plan.nbytes


@pytest.mark.parametrize("rows,min_size,sizes,packed", [
    (("?n",), 1, ((1,), (7,), (45,)), False),  # may be one row: packed per call
    ((45,), 1, ((45,),), True),
    (("?n",), 2, ((2,), (7,), (13,), (45,), (300,)), True),  # never one row: packed once
    (("?b", "?t"), 2, ((2, 2), (3, 7), (5, 13), (8, 50)), True),
    (("?b", 1), 2, ((2, 1), (6, 1), (13, 1)), True),
])
def test_a_weight_is_packed_once_only_where_no_call_is_one_row(rows, min_size, sizes, packed):
    """x @ W^T with a constant W: with static rows the GEMM packs W once; with symbolic rows
    that may be one the graph also serves one row (a GEMV reading W in place), so the GEMM
    packs W per call rather than hold it twice; where every symbolic dim is at least 2
    (`min_size`, Dynamo's graphs) W is packed once. Every row count (fewer than a micro-tile,
    none of its multiples, primes, several MC blocks) matches float64."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((72, 40)).astype(np.float32)
    b = Builder("main")
    x = b.arg("x", "f32", (*rows, 40))
    graph = compile(b.build(b.op("matmul", x, b.constant(w), transpose_b=True)),
                    min_size=min_size)
    for lead in sizes:
        xs = rng.standard_normal((*lead, 40)).astype(np.float32)
        (got,) = graph(xs)
        want = xs.astype(np.float64) @ w.T.astype(np.float64)
        np.testing.assert_allclose(got, want, **tolerance("f32", 40, np.abs(want).max()))
        gemms = [d.winner.config for d in graph.decisions((*lead, 40))
                 if d.winner.method == "blocks.gemm"]
        assert gemms and all(c["prepack"] is packed for c in gemms), (lead, gemms)
