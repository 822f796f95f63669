"""`compile_generated`: modules cached by generator fingerprint never rebuild their IR warm."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import uuid

from tilefold.runtime import compile_generated, kernel_cache
from tilefold.target import host_target

SEVEN = """
define i32 @seven() {
entry:
  ret i32 7
}
"""


def test_make_ir_runs_on_a_miss_only():
    calls = []

    def make_ir():
        calls.append(1)
        return SEVEN

    fingerprint = str(uuid.uuid4())
    first = compile_generated(fingerprint, make_ir, host_target(), name="seven")
    again = compile_generated(fingerprint, make_ir, host_target(), name="seven")
    assert again is first and len(calls) == 1 and not first.from_cache
    assert first.function("seven", ctypes.c_int32)() == 7


def test_source_keys_never_collide_with_ir_keys():
    target = host_target()
    assert kernel_cache.source_key(SEVEN, target, 0) != kernel_cache.cache_key(SEVEN, target, 0)
    assert kernel_cache.source_key("a", target, 0) != kernel_cache.source_key("b", target, 0)


WARM = """
    import ctypes, sys
    from tilefold.runtime import codegen_runs, compile_generated
    from tilefold.target import host_target

    def make_ir():
        print("built")
        return sys.argv[2]

    module = compile_generated(sys.argv[1], make_ir, host_target(), name="seven")
    print(module.from_cache, codegen_runs(), module.function("seven", ctypes.c_int32)())
"""


def test_a_fresh_process_neither_builds_ir_nor_runs_codegen():
    fingerprint = str(uuid.uuid4())

    def run() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(WARM), fingerprint, SEVEN],
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert run() == ["built", "False", "1", "7"]
    assert run() == ["True", "0", "7"]
