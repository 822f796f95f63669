"""The on-disk kernel cache: warm processes skip codegen; bad entries are rebuilt, not trusted."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from tilefold.runtime import compile_llvm_ir, kernel_cache
from tilefold.runtime.codegen import compile_object
from tilefold.target import host_target


def unique_ir(value: int = 7) -> str:
    """A tiny module whose text (and so its cache key) no other test shares."""
    return f"""; {uuid.uuid4()}
define i32 @seven() {{
entry:
  ret i32 {value}
}}
"""


def call_seven(ir: str):
    module = compile_llvm_ir(ir, host_target(), name="seven")
    return module, module.function("seven", ctypes.c_int32)()


WARM_CHECK = """
    import ctypes, sys
    import runtime_pool_kernels as pool_kernels
    from tilefold.runtime import codegen_runs, compile_llvm_ir
    from tilefold.target import host_target
    module = compile_llvm_ir(sys.argv[1], host_target(), name="seven")
    value = module.function("seven", ctypes.c_int32)()
    kernels = pool_kernels.load()
    print(module.from_cache, kernels.module.from_cache, codegen_runs(), value)
"""


def run_warm_check(ir: str) -> list[str]:
    code = textwrap.dedent(WARM_CHECK)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__)}
    done = subprocess.run(
        [sys.executable, "-c", code, ir], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_fresh_process_loads_from_cache_without_codegen():
    ir = unique_ir()
    cold = run_warm_check(ir)
    assert cold[0] == "False" and cold[3] == "7" and int(cold[2]) >= 1
    warm = run_warm_check(ir)
    assert warm == ["True", "True", "0", "7"]


def _write_valid_entry(ir: str) -> str:
    key = kernel_cache.cache_key(ir, host_target(), 0)
    code = compile_object(ir, host_target(), name="seven")
    entry = kernel_cache.CacheEntry("seven", code.data, code.exports, 0.01)
    kernel_cache.store(key, entry, host_target())
    return key


def _corrupt(path, how: str) -> None:
    blob = path.read_bytes()
    if how == "flipped":
        path.write_bytes(blob[:-1] + bytes([blob[-1] ^ 0xFF]))
    elif how == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(os.urandom(len(blob)))
    elif how == "foreign":
        other = _write_valid_entry(unique_ir(8))
        path.write_bytes(kernel_cache.entry_path(other).read_bytes())


@pytest.mark.parametrize("how", ["flipped", "truncated", "empty", "garbage", "foreign"])
def test_bad_entries_are_logged_and_rebuilt(how, caplog):
    ir = unique_ir()
    key = _write_valid_entry(ir)
    path = kernel_cache.entry_path(key)
    _corrupt(path, how)
    with caplog.at_level(logging.WARNING, logger="tilefold.kernels"):
        module, value = call_seven(ir)
    assert value == 7 and not module.from_cache
    assert any("ignored" in record.message for record in caplog.records)
    assert kernel_cache.load(key) is not None  # rewritten whole


def test_several_processes_fill_one_entry_at_once(tmp_path):
    ir = unique_ir()
    script = textwrap.dedent(
        """
        import ctypes, sys
        from tilefold.runtime import compile_llvm_ir
        from tilefold.target import host_target
        module = compile_llvm_ir(sys.argv[1], host_target(), name="seven")
        print(module.function("seven", ctypes.c_int32)())
        """
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script, ir], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outputs = [worker.communicate(timeout=60)[0].strip() for worker in workers]
    assert outputs == ["7"] * 3 and all(worker.returncode == 0 for worker in workers)
    key = kernel_cache.cache_key(ir, host_target(), 0)
    assert kernel_cache.load(key) is not None
    assert not list(kernel_cache.kernels_dir().glob(f".{key[:16]}*"))  # no temp files left


def test_key_covers_ir_target_and_opt_level():
    ir, host = unique_ir(), host_target()
    key = kernel_cache.cache_key(ir, host, 0)
    assert key == kernel_cache.cache_key(ir, host, 0)
    assert key != kernel_cache.cache_key(ir, host, 2)
    assert key != kernel_cache.cache_key(ir + " ", host, 0)
    if host.has("avx2", "fma") and host.name != "x86-64-v3":  # (the forced host is v3 itself)
        assert key != kernel_cache.cache_key(ir, host_target("x86-64-v3"), 0)


def test_an_unwritable_cache_only_costs_recompiles(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(blocker))
    with caplog.at_level(logging.WARNING, logger="tilefold.kernels"):
        module, value = call_seven(unique_ir())
    assert value == 7 and not module.from_cache
    assert any("cannot write" in record.message for record in caplog.records)


def test_clear_empties_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    _write_valid_entry(unique_ir())
    (kernel_cache.kernels_dir() / ".stale.tmp").write_bytes(b"x")
    assert len(kernel_cache.entries()) == 1
    assert kernel_cache.clear() == 1
    assert not list(kernel_cache.kernels_dir().iterdir())
