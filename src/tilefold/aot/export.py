"""`tilefold.export(module, inputs, path)`: the compiler stopped early. The module is compiled
as `tilefold.compile` does, its plan for the inputs' static shapes recorded as a step program
(`aot/program.py`), its kernels linked into a shared library (`aot/link.py`), and the
artifact written as `artifact/format.py` lays it out; `tilefold.load` runs it."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilefold.aot.c_abi import (
    C_LIBRARY,
    HEADER_FILE,
    c_source,
    source_dir,
    symbolic_c_source,
)
from tilefold.aot.link import link_library
from tilefold.aot.program import Program, record
from tilefold.aot.symbolic import MAX_RECORDINGS, Recorder, bounds_of, evaluate, sized_inputs
from tilefold.artifact.cpu import cpuinfo_flags
from tilefold.artifact.format import (
    ALIGN,
    DATA,
    DIGEST,
    ENTRY,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    PROGRAM,
    SIGNATURES,
    digest64_file,
    dtype_name,
    new_library_name,
    sha256_file,
)
from tilefold.compiler import CompiledGraph, compile
from tilefold.errors import ArtifactError, DTypeError, UnsupportedError
from tilefold.ir import Module
from tilefold.ir.interpreter import bind_symbols
from tilefold.runtime.pool_ir import MAX_THREADS
from tilefold.target import Target, host_target, named_target
from tilefold.version import __version__


def export(module: Module | Any, inputs: Sequence[Any], path: str | Path, *,
           target: Target | str | None = None, function: str = "main",
           dynamic_shapes: dict[str, Any] | None = None,
           donate: dict[int, int] | None = None, c_library: bool = False,
           targets: Sequence[Target | str] | None = None) -> Path:
    """Compile `function` of `module` for the static shapes and dtypes of `inputs` (their
    values are only run once) on `target` (default: this host; a name such as "x86-64-v3",
    which this host must be able to run) and write the artifact directory `path` (an artifact
    already there is replaced, anything else refused). Returns `path`.

    `tilefold.export` (`frontend/aot_export.py`) takes a `torch.nn.Module` or an
    `ExportedProgram` too, made a Module first.

    `dynamic_shapes={"s": (lo, hi)}`: one artifact for every size lo..hi of the symbolic
    dim `?s` of the function's arguments, as size classes (`aot/symbolic.py`); the inputs
    then give the dtypes and the other dims' sizes. `{"s": [1, 16, 256]}`: those sizes only.

    `donate={result: argument}` (as `tilefold.compile` takes it): each such argument becomes
    the artifact's *state*, held by the loaded model between calls and written in place (a
    KV cache): `tilefold.load(path).state`.

    `c_library=True` (`tilefold export --c`): the artifact also holds `libtilefold_model.so`,
    the same code linked for C programs alone (the C ABI its only exports, stripped: smaller);
    it runs the artifact's data.bin as the kernels library's C runtime does.

    `targets=["znver4", "x86-64-v3"]` (instead of `target`): a chain, in order of preference;
    the loaders run the first whose CPU features the host has. The plan is recorded for the
    last, which this host must run; a stronger target this host runs too gets a plan of its
    own (compiled and recorded for it: its micro-kernels, register tiles and packed panels,
    in program-<k>.json and data-<k>.bin), and one it cannot run (its code cannot be run to
    record it) holds the last's kernels compiled from their IR for it (each target must have
    every feature of the last: `chain_targets`), sharing program.json and data.bin."""
    if not isinstance(module, Module):
        raise UnsupportedError(
            f"tilefold.export takes a tilefold Module, a torch.nn.Module or a torch.export "
            f"ExportedProgram, not a {type(module).__name__}")
    path = Path(path)
    if not _replaceable(path):  # before any work: a user's directory is never replaced
        raise ArtifactError(f"{path} exists and is not a tilefold artifact; export to a new "
                            "path (an artifact there is replaced)")
    if targets is not None:
        if target is not None:
            raise UnsupportedError("give tilefold.export a target or a chain of targets, "
                                   "not both")
        *stronger, target = chain_targets(targets)
    else:
        stronger = []
    if isinstance(target, str):
        target = named_target(target)
    if target is not None and not target.is_host():
        raise ArtifactError(f"cannot export for {target.name} on this host: the plan is "
                            "recorded by running it here; export on a host that runs it"
                            + (" (the last target of a chain is the one recorded)"
                               if stronger else ""))
    graph = compile(module, target, function=function, donate=donate)
    own = {t.name: compile(module, t, function=function, donate=donate)
           for t in stronger if isinstance(t, Target) and t.is_host()}
    return export_graph(graph, inputs, path, dynamic_shapes=dynamic_shapes,
                        c_library=c_library, stronger=stronger, own=own)


def chain_targets(names: Sequence[Target | str]) -> list[Target]:
    """A chain of targets, named or given, checked: at least one, none twice, and each with
    the architecture and every CPU feature of the last (whose recorded plan the others'
    code is compiled from: its IR assumes those features; `UnsupportedError` otherwise)."""
    chain = [named_target(t) if isinstance(t, str) else t for t in names]
    if not chain:
        raise UnsupportedError("a chain of targets names at least one")
    if len({t.name for t in chain}) != len(chain):
        raise UnsupportedError(f"a chain of targets names each once, not "
                               f"{', '.join(t.name for t in chain)}")
    last = chain[-1]
    for t in chain[:-1]:
        lacks = sorted(last.features - t.features)
        if t.arch != last.arch or lacks:
            raise UnsupportedError(
                f"cannot chain {t.name} before {last.name}: it lacks "
                f"{', '.join(lacks) or last.arch}, which the code recorded for {last.name} "
                "may use; list the targets strongest first, each with every feature of the "
                "last")
    return chain


def export_graph(graph: CompiledGraph, inputs: Sequence[Any], path: str | Path, *,
                 dynamic_shapes: dict[str, Any] | None = None, c_library: bool = False,
                 stronger: Sequence[Target] = (),
                 own: dict[str, CompiledGraph] | None = None) -> Path:
    """`export` of a graph compiled already (by `tilefold.compile`, for a target this host
    runs): its plans and kernels are the ones it has, its `donate`d arguments the state.
    `stronger`: the targets of a chain before the graph's (`chain_targets`); `own`: graphs
    of the same function compiled for some of them (by name; each recorded as its target's
    own plan, the others running the graph's)."""
    path = Path(path)
    if not _replaceable(path):
        raise ArtifactError(f"{path} exists and is not a tilefold artifact; export to a new "
                            "path (an artifact there is replaced)")
    target = graph.target or host_target()
    if not target.is_host():
        raise ArtifactError(f"cannot export a graph compiled for {target.name} on this "
                            "host: the plan is recorded by running it here")
    chain = chain_targets([*stronger, target])
    arrays = [np.asarray(a) for a in inputs]
    bind_symbols(graph.function, arrays)  # count, dtypes and shapes, as a call checks them
    graphs = [(own or {}).get(t.name) for t in chain[:-1]] + [graph]
    for t, g in zip(chain, graphs, strict=True):
        if g is not None and ((g.target or host_target()).name != t.name
                              or not t.is_host()):
            raise ArtifactError(f"cannot record {t.name}'s own plan: give a graph compiled "
                                f"for {t.name} on a host that runs it")
    plans = [None if g is None else
             _static_plan(g, arrays, t) if dynamic_shapes is None else
             _symbolic_plan(g, arrays, t, dynamic_shapes)
             for t, g in zip(chain, graphs, strict=True)]
    return _write(path, chain, plans, c_library)


@dataclass
class _Recorded:
    """One target's recorded plan, as `_write` writes it: the step program, the buffers
    data.bin holds, the modules and signatures its calls name, the C runtime's source maker
    and replay functions, and the manifest made from it."""

    steps: dict[str, Any]
    saved: list[Any]
    modules: list[Any]
    signatures: list[str]
    runtime: Any
    replays: Sequence[tuple[str, str, list[str]]]
    manifest: dict[str, Any]


def _static_plan(graph: CompiledGraph, arrays: list[np.ndarray], target: Target
                 ) -> _Recorded:
    program = record(graph, arrays)
    manifest = _manifest(graph, arrays, program, target)
    steps, saved = program.layout()
    _check_state(graph, steps)
    return _Recorded(steps, saved, list(program.modules.values()), program.signatures,
                     c_source, (), manifest)


def _check_state(graph: CompiledGraph, steps: dict[str, Any]) -> None:
    """Each donated result must be its argument's very memory: the state advances in place."""
    for r, a in graph.donate.items():
        out, arg = steps["outputs"][r], steps["inputs"][a]
        if out["at"] != arg["at"] or out["strides"] != arg["strides"]:
            raise UnsupportedError(
                f"cannot export: result {r} of {graph.function.name} is donated to argument "
                f"%{graph.function.args[a].name} but not written into it in place (a state "
                "must be updated where it lies); `tilefold explain` shows the step that "
                "writes it")


def _symbolic_plan(graph: Any, arrays: list[np.ndarray], target: Target, dynamic_shapes: Any
                   ) -> _Recorded:
    *outer, (symbol, sizes) = bounds_of(graph, dynamic_shapes)
    lo, hi = sizes[0], sizes[-1]
    combinations = list(itertools.product(*(s for _, s in outer)))
    if len(combinations) * len(sizes) > MAX_RECORDINGS:
        raise UnsupportedError(
            f"cannot export {' x '.join(f'?{name}' for name, _ in (*outer, (symbol, sizes)))} "
            f"at {len(combinations) * len(sizes)} sizes: an export records every size, at "
            f"most {MAX_RECORDINGS}; give smaller ranges")
    recorder = Recorder(graph, arrays, symbol)
    classes = []
    for values in combinations:  # the other symbols at each of their sizes, in turn
        recorder.fixed = {name: v for (name, _), v in zip(outer, values, strict=True)}
        for c in recorder.classes(sizes):
            classes.append({**c, "at": list(values)} if outer else c)
    for c in classes:
        _check_state(graph, evaluate(c["program"], c["lo"]))
    first = recorder.first
    smallest = {name: s[0] for name, s in (*outer, (symbol, sizes))}
    manifest = _manifest(graph, sized_inputs(graph, arrays, smallest), first, target)
    fn = graph.function
    for side, values in (("inputs", fn.args), ("outputs", fn.outputs)):
        for spec, v in zip(manifest[side], values, strict=True):
            spec["shape"] = [d if isinstance(d, int) else str(d) for d in v.type.shape]
    manifest["symbols"] = {}
    for name, listed in (*outer, (symbol, sizes)):
        manifest["symbols"][name] = {"min": listed[0], "max": listed[-1]}
        if len(listed) != listed[-1] - listed[0] + 1:
            manifest["symbols"][name]["sizes"] = listed
    manifest["size_classes"] = [[c["lo"], c["hi"], *([dict(zip(
        (name for name, _ in outer), c["at"], strict=True))] if outer else [])]
        for c in classes]
    # data.bin: each class's saved buffers, the same bytes saved once unless a buffer holds
    # pointer words (those are written per class at load, so each class keeps its own).
    saved: list[Any] = []
    at: dict[bytes, int] = {}
    offset = 0
    replays = []
    for k, c in enumerate(classes):
        steps = c["program"]
        holders = {where[0] for where, _ in steps["pointers"]}  # written per class at load
        holders |= {buffer for buffer, _, _ in steps["patches"]}
        data_specs = [(b, spec) for b, spec in enumerate(steps["buffers"])
                      if spec["kind"] == "data"]
        for (b, spec), buffer in zip(data_specs, c["saved"], strict=True):
            content = buffer.content()
            if b in holders or content not in at:
                at[content] = offset
                saved.append(buffer)
                offset += -(-len(content) // ALIGN) * ALIGN
            spec["offset"] = at[content]
        replays.append((f"{ENTRY}_{k}", f"{SIGNATURES}_{k}",
                        [call["signature"] for call in steps["calls"]]))
        c["entry"], c["signatures"] = replays[-1][:2]
    program = {"symbol": symbol, "min": lo, "max": hi,
               "classes": [{key: c[key] for key in ("lo", "hi", "at", "entry", "signatures",
                                                    "program") if key in c} for c in classes]}
    if outer:  # the symbols a class holds at one size each (`at`, in this order)
        program["outer"] = [name for name, _ in outer]
    return _Recorded(program, saved, list(recorder.modules.values()), [], symbolic_c_source,
                     replays, manifest)



def _specs(names: list[str], arrays: Sequence[np.ndarray]) -> list[dict[str, Any]]:
    specs = []
    for name, a in zip(names, arrays, strict=True):
        dtype = dtype_name(a.dtype)
        if dtype is None:
            raise DTypeError(f"cannot export: %{name} is {a.dtype}; an artifact takes and "
                             "returns NumPy's own dtypes (f64, f32, f16, i64, i32, i8, u8, "
                             "bool)")
        specs.append({"name": name, "dtype": dtype, "shape": list(a.shape)})
    return specs


def _manifest(graph: Any, arrays: list[np.ndarray], program: Program, target: Target
              ) -> dict[str, Any]:
    fn = graph.function
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "tilefold_version": __version__,
        "function": fn.name,
        "inputs": _specs([a.name for a in fn.args], arrays),
        "outputs": _specs([v.name for v in fn.outputs], program.results),
        "target": _target_entry(target),
        "pool": {"max_threads": MAX_THREADS},
        "state": [{"input": a, "output": r} for r, a in sorted(graph.donate.items())],
    }


def _target_entry(target: Target) -> dict[str, Any]:
    """The manifest's description of a target (its CPU features: those its code uses, which
    `_write` fills in as the library is linked)."""
    return {"name": target.name, "arch": target.arch, "triple": target.triple,
            "cpu": target.cpu, "cpu_features": []}


def _replaceable(path: Path) -> bool:
    """Whether `path` is free for an artifact: absent, an empty directory, or an artifact
    (never anything else a user keeps there)."""
    if not path.exists():
        return True
    if not path.is_dir():
        return False
    try:
        return not any(path.iterdir()) or json.loads(
            (path / MANIFEST).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _write(path: Path, chain: list[Target], plans: list[_Recorded | None],
           c_library: bool = False) -> Path:
    """Write the parts into a fresh directory beside `path`, then move it into place: a
    failed export never leaves half an artifact. One library per target of the `chain`, each
    with the chain's table for the C runtime to pick from; `plans[k]`: target k's own
    recorded plan, or None where it runs the last's (which is never None), whose program and
    data are program.json and data.bin (another's: program-<k>.json and data-<k>.bin). A
    chain's manifest lists each target in `targets`; its `target`, library part and the rest
    are the first's, its inputs, outputs and symbols the last plan's (every plan's are
    alike)."""
    last = plans[-1]
    assert last is not None
    manifest = last.manifest
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as exc:
        raise ArtifactError(f"cannot write the artifact {path}: {exc}") from None
    try:
        libraries = [new_library_name() for _ in chain]
        runs = [k if plan is not None else len(chain) - 1 for k, plan in enumerate(plans)]
        files: dict[int, tuple[str, str]] = {}  # plan -> (program file, data file)
        data: dict[int, dict[str, Any]] = {}
        for k in dict.fromkeys(runs):
            plan = plans[k]
            assert plan is not None
            files[k] = (PROGRAM, DATA) if k == len(chain) - 1 else \
                (f"program-{k}.json", f"data-{k}.bin")
            (tmp / files[k][0]).write_text(json.dumps(plan.steps, separators=(",", ":")))
            with (tmp / files[k][1]).open("wb") as f:
                for b in plan.saved:
                    content = b.content()
                    f.write(content + bytes(-len(content) % ALIGN))
            data[k] = {DIGEST: digest64_file(tmp / files[k][1]),
                       "bytes": (tmp / files[k][1]).stat().st_size}

        links = [{"name": t.name, "library": file,
                  "flags": cpuinfo_flags(sorted(t.features))[0]}
                 for t, file in zip(chain, libraries, strict=True)]
        members = []
        for k, (target, file) in enumerate(zip(chain, libraries, strict=True)):
            entry = _target_entry(target)
            plan = plans[runs[k]]
            assert plan is not None

            def c_runtime(features: list[str], entry: dict[str, Any] = entry, k: int = k,
                          plan: _Recorded = plan) -> str:
                # A host's own target may name features no /proc/cpuinfo flag shows (newer
                # than the loaders' table): listed apart, honestly, not failing every load.
                unchecked = cpuinfo_flags(features)[1]
                entry["cpu_features"] = [f for f in features if f not in unchecked]
                entry["unchecked_features"] = unchecked
                return plan.runtime(plan.steps, {**plan.manifest, "target": entry,
                                                 "chain": links, "self": k,
                                                 "data_file": files[runs[k]][1]},
                                    data[runs[k]][DIGEST], data[runs[k]]["bytes"])

            recorded = k == len(chain) - 1
            link_library(plan.modules, plan.signatures, target, tmp / file, c_runtime,
                         plan.replays,
                         tmp / C_LIBRARY if c_library and recorded else None,
                         retarget=plans[k] is None)
            program, data_file = files[runs[k]]
            members.append({**entry, "library": _part(tmp / file), "plan": chain[runs[k]].name,
                            "kernels": [m.name for m in plan.modules],  # for people, tests
                            "program": _part(tmp / program), "data": _part(tmp / data_file)})
            if plans[k] is not None and "size_classes" in plans[k].manifest and not recorded:
                members[-1]["size_classes"] = plans[k].manifest["size_classes"]
        manifest["target"] = {key: members[0][key] for key in (*_target_entry(chain[0]),
                                                               "unchecked_features")}
        if len(chain) > 1:  # each target's library, and the plan it runs
            manifest["targets"] = members
        if c_library:  # for people and tools: no loader checks it (the dynamic linker loads it)
            manifest["c_library"] = {"file": C_LIBRARY, "bytes": (tmp / C_LIBRARY).stat().st_size,
                                     "sha256": sha256_file(tmp / C_LIBRARY)}
        shutil.copy(source_dir() / HEADER_FILE, tmp / HEADER_FILE)
        first = files[runs[0]]
        manifest["parts"] = {part: _part(tmp / file) for part, file in (
            ("library", libraries[0]), ("program", first[0]), ("data", first[1]))}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _part(path: Path) -> dict[str, Any]:
    """A part's entry in the manifest: its file, size and digests."""
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path),
            DIGEST: digest64_file(path)}
