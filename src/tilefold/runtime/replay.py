"""Replay: a recorded sequence of native calls run by one native call (a CPU "CUDA graph").

A compiled graph's kernels are ctypes functions called on array objects, parameter blocks and
constants. Once those are fixed (the same arrays every call: a decode step's weights, cache and
buffers), the whole sequence can run without Python between the kernels: `Replay(calls)`
writes every call's function address and arguments into one int64 table and compiles a
function that loads each call's arguments from the table and makes the call. The function's
IR depends only on the calls' signatures, not on the addresses, so it is compiled once per
signature sequence and cached on disk like any kernel; the table is the recording.
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefold.errors import UnsupportedError
from tilefold.runtime.compile import compile_generated
from tilefold.runtime.switch import Switch
from tilefold.target import host_target

ENTRY = "tf_replay"
# An argument's kind: its LLVM type and how the table holds it (floats as their bits).
_LLVM = {"p": "i8*", "q": "i64", "i": "i32", "f": "float", "d": "double"}
_INTS = {ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_uint8, ctypes.c_uint16,
         ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.c_bool}


# Set while a step's calls are recorded for a program that runs one call sequence at a time (an
# exported artifact, whose loader holds a lock around each step): kernels that share a buffer
# between instances (and lock it when run from Python) may then give native calls.
EXCLUSIVE = Switch("tilefold_exclusive_replay")
exclusive_replay = EXCLUSIVE.on


@dataclass(frozen=True)
class NativeCall:
    """One call of a native function: `function` is a ctypes function (its `argtypes` say how
    `args` are passed); calling `function(*args)` must have the same effect as replaying it.
    `keep` holds objects the arguments point into (a parameter block passed by address);
    `scratch` arrays likewise, whose contents the call writes before it reads them (a
    workspace: an exported artifact allocates them empty instead of saving their bytes)."""

    function: Any
    args: tuple
    keep: tuple = ()
    scratch: tuple = ()

    def __call__(self) -> None:
        self.function(*self.args)


def _kind(argtype: Any) -> str:
    if argtype is ctypes.c_float:
        return "f"
    if argtype is ctypes.c_double:
        return "d"
    if argtype in _INTS:
        return "i"
    if argtype in (ctypes.c_int64, ctypes.c_uint64, ctypes.c_longlong, ctypes.c_ulonglong,
                   ctypes.c_ssize_t, ctypes.c_size_t):
        return "q"
    if argtype is ctypes.py_object or argtype in (ctypes.c_void_p, ctypes.c_char_p) or \
            (isinstance(argtype, type) and issubclass(argtype, ctypes._Pointer)):
        return "p"
    raise UnsupportedError(f"replay: a native call takes an argument of type {argtype!r}, "
                           "which replay does not pass (pointers, integers, float, double)")


def table_value(kind: str, argtype: Any, value: Any) -> int:
    """The int64 table entry holding `value` passed as `argtype`."""
    if kind == "f":
        return struct.unpack("<i", struct.pack("<f", value))[0]
    if kind == "d":
        return struct.unpack("<q", struct.pack("<d", value))[0]
    if argtype is ctypes.py_object:
        return id(value)
    if kind == "p":
        if value is None:
            return 0
        if isinstance(value, int):
            return value
        return ctypes.cast(value, ctypes.c_void_p).value or 0
    return int(value)


def call_signature(function: Any) -> str:
    """The kinds of `function`'s arguments, one letter each (the replay's and an exported
    step program's signature of a call)."""
    argtypes = getattr(function, "argtypes", None)
    if argtypes is None or getattr(function, "restype", None) is not None:
        raise UnsupportedError("replay: native calls must be ctypes functions with argtypes "
                               "and no result")
    return "".join(_kind(t) for t in argtypes)


def replay_ir(signatures: Sequence[str]) -> str:
    """`tf_replay(i64* table)`: for each signature in turn, a call of the function whose
    address is the next table entry, with the following entries as its arguments."""
    lines = [f"define void @{ENTRY}(i64* %t) {{", "entry:"]
    slot = 0
    for c, sig in enumerate(signatures):
        fn_type = f"void ({', '.join(_LLVM[k] for k in sig)})"
        lines += [f"  %g{c} = getelementptr i64, i64* %t, i64 {slot}",
                  f"  %a{c} = load i64, i64* %g{c}",
                  f"  %f{c} = inttoptr i64 %a{c} to {fn_type}*"]
        args = []
        for i, kind in enumerate(sig):
            slot += 1
            v = f"%v{c}_{i}"
            lines += [f"  %g{c}_{i} = getelementptr i64, i64* %t, i64 {slot}",
                      f"  {v}q = load i64, i64* %g{c}_{i}"]
            if kind == "p":
                lines.append(f"  {v} = inttoptr i64 {v}q to i8*")
            elif kind == "q":
                v = f"{v}q"
            elif kind == "d":
                lines.append(f"  {v} = bitcast i64 {v}q to double")
            else:
                lines.append(f"  {v}i = trunc i64 {v}q to i32")
                if kind == "f":
                    lines.append(f"  {v} = bitcast i32 {v}i to float")
                else:
                    v = f"{v}i"
            args.append(f"{_LLVM[kind]} {v}")
        slot += 1
        lines.append(f"  call void %f{c}({', '.join(args)})")
    lines += ["  ret void", "}"]
    return "\n".join(lines) + "\n"


class Replay:
    """`calls` made by one native call: `replay()` runs them in order. The arguments (array
    objects, parameter blocks) must stay valid and unmoved: the replay keeps a reference to
    each argument object, and the caller guarantees the memory they point to lives on."""

    def __init__(self, calls: Sequence[NativeCall]):
        self.calls = list(calls)
        signatures = [call_signature(c.function) for c in self.calls]
        table: list[int] = []
        for call, sig in zip(self.calls, signatures, strict=True):
            table.append(ctypes.cast(call.function, ctypes.c_void_p).value)
            if len(call.args) != len(sig):
                raise UnsupportedError(f"replay: a call passes {len(call.args)} arguments to a "
                                       f"function taking {len(sig)}")
            table += [table_value(k, t, a) for k, t, a in
                      zip(sig, call.function.argtypes, call.args, strict=True)]
        self.table = np.array(table or [0], np.int64)
        self._table_ptr = self.table.ctypes.data
        digest = hashlib.sha256("|".join(signatures).encode()).hexdigest()
        module = compile_generated(f"replay|{digest}", lambda: replay_ir(signatures),
                                   host_target(), name="tf_replay")
        self._entry = module.function(ENTRY, None, ctypes.c_void_p)

    def __call__(self) -> None:
        self._entry(self._table_ptr)

    def __len__(self) -> int:
        return len(self.calls)
