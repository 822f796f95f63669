"""Replay (`runtime/replay.py`): recorded native calls run by one native call, each call seeing
exactly the arguments it was recorded with, in order, whatever their kinds."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tilefold.errors import UnsupportedError
from tilefold.runtime.replay import NativeCall, Replay, replay_ir

SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.py_object, ctypes.c_int32, ctypes.c_float,
                             ctypes.c_double, ctypes.c_void_p, ctypes.c_int64)


def test_calls_run_in_order_with_their_arguments():
    seen = []
    callback = SIGNATURE(lambda *args: seen.append(args))
    array = np.arange(3)
    calls = [NativeCall(callback, (array, -7, 1.25, -3.5e300, 4096, -(2**40))),
             NativeCall(callback, ("text", 2**31 - 1, float("inf"), 0.1, None, 2**62))]
    replay = Replay(calls)
    for _ in range(2):
        replay()
    assert len(seen) == 4
    first, second = seen[0], seen[1]
    assert first[0] is array and first[1:] == (-7, 1.25, -3.5e300, 4096, -(2**40))
    assert second == ("text", 2**31 - 1, float("inf"), 0.1, None, 2**62)
    assert seen[2:] == seen[:2]
    assert len(replay) == 2


def test_a_float_argument_is_rounded_to_single_precision_once():
    seen = []
    callback = ctypes.CFUNCTYPE(None, ctypes.c_float)(seen.append)
    Replay([NativeCall(callback, (0.1,))])()
    assert seen == [float(np.float32(0.1))]


def test_the_ir_depends_on_signatures_only():
    assert replay_ir(["pq", "f"]) == replay_ir(["pq", "f"])
    assert replay_ir(["pq", "f"]) != replay_ir(["pq", "d"])
    assert "call void" in replay_ir(["pidfq"])


def test_functions_with_a_result_or_no_argtypes_are_refused():
    with_result = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
    with pytest.raises(UnsupportedError, match="no result"):
        Replay([NativeCall(with_result, ())])
    struct = ctypes.CFUNCTYPE(None, ctypes.c_char * 4)
    with pytest.raises(UnsupportedError, match="does not pass"):
        Replay([NativeCall(struct(lambda x: None), (b"abcd",))])


def test_an_empty_replay_does_nothing():
    Replay([])()
