"""The LTO kernel library: `data/lto/*.ll` built to optimized bitcode once per target (cached
on disk), then linked into a generated module whose calls LLVM inlines.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from importlib import resources

import llvmlite.binding as llvm

from tilefold.runtime.codegen import LLVM_LOCK
from tilefold.target import Target, cache_dir, target_machine

LIBRARY = "rowlib.ll"
PREFIX = "tf_lib_"


def library_source() -> str:
    return resources.files("tilefold.data").joinpath("lto").joinpath(LIBRARY).read_text()


def library_bitcode(target: Target) -> bytes:
    """The library optimized for `target`, as bitcode; built on first use, then read from disk."""
    source = library_source()
    tag = f"{source}|{target.triple}|{target.cpu}|{target.llvm_features()}|{llvm.llvm_version_info}"
    path = cache_dir() / "lto" / f"{hashlib.sha256(tag.encode()).hexdigest()[:20]}.bc"
    with contextlib.suppress(OSError):
        return path.read_bytes()
    with LLVM_LOCK:
        machine = target_machine(target)
        module = llvm.parse_assembly(source)
        module.triple = target.triple
        module.data_layout = str(machine.target_data)
        module.verify()
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        builder = llvm.create_pass_builder(machine, tuning)
        builder.getModulePassManager().run(module, builder)
        bitcode = module.as_bitcode()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
            tmp.write(bitcode)
        os.replace(tmp.name, path)
    return bitcode


def link_library(generated_ir: str, target: Target) -> str:
    """`generated_ir` with the library linked in and made internal, so that after inlining
    (opt level >= 1) no library symbol or call remains."""
    bitcode = library_bitcode(target)
    with LLVM_LOCK:
        module = llvm.parse_assembly(generated_ir)
        module.link_in(llvm.parse_bitcode(bitcode))
        for fn in module.functions:
            if fn.name.startswith(PREFIX) and not fn.is_declaration:
                fn.linkage = llvm.Linkage.internal
        return str(module)
