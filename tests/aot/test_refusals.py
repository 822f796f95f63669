"""What cannot be exported is refused with an `UnsupportedError` naming it: a step that runs
Python, a call into code no compiled module holds, a Python object other than an array handed
to a kernel, and a parameter block holding an address of memory the program does not know."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

import tilefold
from tests.aot.graphs import GRAPHS, RNG_SEED, random_inputs
from tilefold.aot.program import record
from tilefold.errors import ArtifactError, DTypeError, ShapeError, UnsupportedError
from tilefold.ir import parse_module
from tilefold.runtime.replay import NativeCall
from tilefold.strategy.select import native_steps


def test_a_step_running_python_is_refused_by_name(tmp_path) -> None:
    module = parse_module("module {\n  func @main(%x: f32[4,8]) -> (f32[4,8]) {\n"
                          "    %0 = cumsum(%x) {axis = 1} : f32[4,8]\n    return(%0)\n  }\n}\n")
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(UnsupportedError, match=r"step 'extern.numpy: cumsum .*runs in Python"):
        tilefold.export(module, [x], tmp_path / "cumsum.tfa")
    assert not (tmp_path / "cumsum.tfa").exists()


def _record_with(change: Callable[[NativeCall], NativeCall]):
    """Record the MLP with its first native call replaced by `change(call)`."""
    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS["mlp"](rng)
    inputs = random_inputs(module, rng)
    graph = tilefold.compile(module)
    with native_steps():  # a plan as `record` makes it (not kept by the graph), handed to it
        plan = graph.plan_for(*[a.shape for a in inputs], reuse=False)
    graph.plan_for = lambda *shapes, reuse=True: plan
    native = plan.natives[0]

    def changed(env):
        first, *rest = native(env)
        return [change(first), *rest]

    plan.natives[0] = changed
    try:
        return record(graph, inputs)
    finally:
        plan.natives[0] = native


_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda p: None)


def test_a_call_into_code_no_module_holds_is_refused() -> None:
    with pytest.raises(UnsupportedError, match="no compiled tilefold module holds"):
        _record_with(lambda call: NativeCall(_CALLBACK, (0,)))


def test_a_python_object_other_than_an_array_is_refused() -> None:
    def text_for_an_array(call: NativeCall) -> NativeCall:
        assert call.function.argtypes[1] is ctypes.py_object
        return replace(call, args=(call.args[0], "text", *call.args[2:]))

    with pytest.raises(UnsupportedError, match="takes a Python str, not an array"):
        _record_with(text_for_an_array)


def test_a_parameter_block_pointing_out_of_sight_is_refused() -> None:
    """The GEMM's parameter block holds the address of its batch offsets: without them in
    the call's `keep`, the address points into no buffer of the program."""
    def hide_the_offsets(call: NativeCall) -> NativeCall:
        *kept, offsets = call.keep  # (workspace, parameter block, *NativePlan.pointed)
        assert offsets.dtype == np.int64
        return replace(call, keep=tuple(kept))

    program = _record_with(lambda call: call)
    assert program.memory.pointer_words()  # the offsets' address, relocated
    with pytest.raises(UnsupportedError, match="parameter block holds the address"):
        _record_with(hide_the_offsets).memory.pointer_words()


def test_an_argument_pointing_out_of_sight_is_refused() -> None:
    hidden = np.zeros(64, np.float32)

    def pointing_to_hidden(call: NativeCall) -> NativeCall:
        return replace(call, args=(*call.args[:-1], hidden.ctypes.data))

    with pytest.raises(UnsupportedError, match=r"points to memory .* in no buffer"):
        _record_with(pointing_to_hidden)


def test_an_artifact_that_cannot_be_written_is_an_artifact_error(tmp_path) -> None:
    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS["norms"](rng)
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ArtifactError, match="cannot write the artifact"):
        tilefold.export(module, random_inputs(module, rng), tmp_path / "file" / "out.tfa")


def test_a_path_holding_anything_but_an_artifact_is_never_replaced(tmp_path) -> None:
    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS["norms"](rng)
    inputs = random_inputs(module, rng)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    for path in (tmp_path / "mine", tmp_path / "mine" / "notes.txt"):
        with pytest.raises(ArtifactError, match="exists and is not a tilefold artifact"):
            tilefold.export(module, inputs, path)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    tilefold.export(module, inputs, tmp_path / "model.tfa")
    tilefold.export(module, inputs, tmp_path / "model.tfa")  # an artifact is replaced


def test_example_inputs_are_checked_against_the_function(tmp_path) -> None:
    module = GRAPHS["mlp"](np.random.default_rng(RNG_SEED))
    with pytest.raises(ShapeError, match="%x"):
        tilefold.export(module, [np.zeros((8, 63), np.float32)], tmp_path / "a.tfa")
    with pytest.raises(DTypeError, match="%x"):
        tilefold.export(module, [np.zeros((8, 64), np.float64)], tmp_path / "a.tfa")
    with pytest.raises(ShapeError, match="takes 1 inputs, got 2"):
        tilefold.export(module, [np.zeros((8, 64), np.float32)] * 2, tmp_path / "a.tfa")
    assert not (tmp_path / "a.tfa").exists()
