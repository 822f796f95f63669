"""The artifact's shared library: each module the step program calls compiled again from its IR
as position-independent code (same IR, target and codegen options as in the process; a
portable module, such as the native copy, for the artifact's target), its
symbols renamed `m<n>.<name>` (modules are separate namespaces in the JIT, one namespace
here), the native thread pool, the replay entry `tf_replay` and the C runtime
(`aot/c_abi.py`) beside them, linked by the system C compiler with libc, libm and libpthread
alone; for `export --c`, linked a second time into a stripped library for C programs that
exports the C ABI alone."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from tilefold.aot.c_abi import source_dir
from tilefold.aot.program import library_symbol
from tilefold.artifact.format import ENTRY, SIGNATURES
from tilefold.errors import ArtifactError
from tilefold.runtime.codegen import compile_object
from tilefold.runtime.compiled_module import CompiledModule
from tilefold.runtime.pool_ir import pool_ir
from tilefold.runtime.replay import replay_ir
from tilefold.target import Target


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ArtifactError(f"tilefold export links the kernels with the system's {name}, "
                            f"which is not on PATH; install a C toolchain (binutils, gcc/clang)")
    return path


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ArtifactError(f"{' '.join(command[:2])} ... failed ({done.returncode}): "
                            f"{done.stderr.strip()[-2000:]}")


def _replay(signatures: Sequence[str], entry: str = ENTRY, named: str = SIGNATURES) -> str:
    """`tf_replay` for these call signatures, and the signatures as a string beside it (a
    symbolic artifact has one of each per size class, named apart: `entry`, `named`)."""
    text = "|".join(signatures)  # letters and bars only: no IR string escapes needed
    ir = replay_ir(signatures)
    if entry != ENTRY:
        ir = ir.replace(f"@{ENTRY}(", f"@{entry}(", 1)
    return ir + f"@{named} = constant [{len(text) + 1} x i8] " + f'c"{text}\\00"\n'


C_ABI = ("tf_model_load", "tf_model_run", "tf_model_state", "tf_model_free",
         "tf_last_error")  # the header's


def link_library(modules: Sequence[CompiledModule], signatures: Sequence[str], target: Target,
                 out: Path, c_runtime: Callable[[list[str]], str],
                 replays: Sequence[tuple[str, str, Sequence[str]]] = (),
                 c_only: Path | None = None, retarget: bool = False) -> list[str]:
    """Write the library to `out`, the C runtime `c_runtime(features)` compiled in; returns
    the CPU features its code assumes (LLVM names). `replays`: (entry, signatures' name,
    signatures) of each replay function, when not the one `tf_replay` of `signatures`.
    `c_only`: also link the same objects into a library for C programs alone, exporting
    only the C ABI (`C_ABI`: the kernels, the pool and the replay hidden, so the linker
    drops what the C runtime does not reach) and stripped. `retarget`: every module compiled
    for `target` (a stronger target of a chain, which has every feature of the modules' own:
    `aot.export.chain_targets`), not only the portable ones.

    Linked -Bsymbolic: the libraries of a chain export the same C ABI, and one forwards to
    another (`runtime_common.h`), so each binds its own symbols to itself."""
    cc, objcopy = _tool("cc"), _tool("objcopy")
    features = set(target.features)
    with tempfile.TemporaryDirectory(prefix="tilefold-export-") as tmp:
        objects = []
        for number, module in enumerate(modules):
            recipe = module.recipe
            here = target if (recipe.portable or retarget) \
                and module.target.arch == target.arch else module.target
            code = compile_object(recipe.make_ir(), here, name=module.name,
                                  opt_level=recipe.opt_level, jit=False,
                                  strength_reduce=recipe.strength_reduce, pic=True)
            features |= here.features
            path = Path(tmp) / f"m{number}.o"
            path.write_bytes(code.data)
            renames = Path(tmp) / f"m{number}.syms"
            renames.write_text("".join(f"{s} {library_symbol(number, s)}\n"
                                       for s in code.exports))
            _run([objcopy, f"--redefine-syms={renames}", str(path)])
            objects.append(path)
        replay = "".join(_replay(sigs, entry, named) for entry, named, sigs in replays) \
            if replays else _replay(signatures)
        for name, ir in (("pool", pool_ir(target.arch)), ("replay", replay)):
            path = Path(tmp) / f"{name}.o"
            path.write_bytes(compile_object(ir, target, name=name, jit=False, pic=True).data)
            objects.append(path)
        runtime = Path(tmp) / "model.c"
        runtime.write_text(c_runtime(sorted(features)))
        link = [cc, "-shared", "-fPIC", "-O2", f"-I{source_dir()}", str(runtime),
                *map(str, objects), "-lm", "-lpthread", "-Wl,-z,noexecstack", "-Wl,-Bsymbolic"]
        _run([*link, "-o", str(out)])
        if c_only is not None:
            exports = Path(tmp) / "exports.map"
            exports.write_text("{ global: " + "; ".join(C_ABI) + "; local: *; };\n")
            _run([*link, "-o", str(c_only), f"-Wl,--version-script={exports}",
                  "-Wl,--gc-sections", "-s"])
    return sorted(features)
