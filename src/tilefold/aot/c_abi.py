"""The C ABI of an artifact (`data/aot/tilefold_model.h`): the step program written as C
arrays ahead of the C runtime (`data/aot/runtime.c`; a symbolic artifact's size classes ahead
of `data/aot/runtime_symbolic.c`, their integers as expressions of the size), compiled into
the artifact's library, so `tf_model_load`, `tf_model_run` and `tf_model_free` run the model
with no Python."""

from __future__ import annotations

from importlib import resources
from typing import Any

import numpy as np

from tilefold.artifact.cpu import cpuinfo_flags
from tilefold.artifact.format import DTYPES, HEADER, HEADER_WORDS
from tilefold.errors import ArtifactError

HEADER_FILE = "tilefold_model.h"
C_LIBRARY = "libtilefold_model.so"  # export --c: the library for C programs alone
_KINDS = {"data": 0, "workspace": 1, "input": 2, "output": 3, "status": 4}
_ARGS = {"value": 0, "addr": 1, "object": 2}
_ITEMSIZE = {"f64": 8, "f32": 4, "f16": 2, "i64": 8, "i32": 4, "i8": 1, "u8": 1, "bool": 1}


def source_dir() -> Any:
    """The directory holding the runtime's C source and header."""
    return resources.files("tilefold") / "data" / "aot"


def _rows(name: str, rows: list[list[int]], width: int) -> str:
    """`static const int64_t name[][width]`, with a row of zeros when there is none (C has
    no empty arrays; the count macros say how many rows are real)."""
    body = ",\n".join("  {" + ", ".join(str(int(v)) for v in row) + "}"
                      for row in rows or [[0] * width])
    return f"static const int64_t {name}[][{width}] = {{\n{body}}};\n"


def _list(ctype: str, name: str, values: list[str]) -> str:
    return f"static const {ctype} {name}[] = {{{', '.join(values or ['0'])}}};\n"


def _state_tables(manifest: dict[str, Any], classes: list[tuple[dict[str, Any], int, int]]
                  ) -> tuple[str, set[int], set[int]]:
    """The state's C tables (`tf_state_specs`: dtype, rank, the first of its dims in
    `tf_state_dims`; `tf_state_buffers`: each class's buffer holding it, class by class) for
    `classes` (a program, the number of its first buffer among all, its smallest size), and
    the state's input and output numbers, which tf_model_run does not take: the model holds
    the state, in one buffer of its own that every class shares."""
    from tilefold.aot.symbolic import evaluate

    pairs = manifest.get("state", [])
    specs, dims, buffers = [], [], []
    for p in pairs:
        spec = manifest["inputs"][p["input"]]
        specs.append([list(DTYPES).index(spec["dtype"]), len(spec["shape"]), len(dims)])
        dims += spec["shape"]
    for steps, first, n in classes:
        for p, spec in zip(pairs, specs, strict=True):
            number, offset = evaluate(steps["inputs"][p["input"]]["at"], n)
            nbytes = int(np.prod(dims[spec[2]:spec[2] + spec[1]])) * _ITEMSIZE[
                list(DTYPES)[spec[0]]]
            if offset != 0 or evaluate(steps["buffers"][number]["bytes"], n) != nbytes:
                raise ArtifactError(f"state input {p['input']} is not a buffer of its own")
            buffers.append(str(first + number))
    text = "".join([_rows("tf_state_specs", specs, 3),
                    _list("int64_t", "tf_state_dims", [str(int(d)) for d in dims]),
                    _list("int64_t", "tf_state_buffers", buffers)])
    return text, {p["input"] for p in pairs}, {p["output"] for p in pairs}


def _chain_tables(manifest: dict[str, Any]) -> str:
    """The chain of targets the artifact was exported for (`manifest["chain"]`: each one's
    name, library file and /proc/cpuinfo flags; `manifest["self"]`: this library's place in
    it), for tf_model_load to pick the first this CPU runs (`runtime_common.h`), and the
    file of the data this library's plan runs on (`manifest["data_file"]`: data.bin, or a
    chain's target's own data-<k>.bin)."""
    chain = manifest["chain"]
    data_file = manifest.get("data_file", "data.bin")  # this library's plan's data
    for link in chain:  # written into C strings: names the exporter made, checked anyway
        text = "".join([link["name"], link["library"], *link["flags"], data_file])
        if not all(c.isalnum() or c in "-_." for c in text):
            raise ArtifactError(f"target {link['name']!r}: a name the C tables cannot hold")
    return "".join([
        f"#define TF_NCHAIN {len(chain)}\n#define TF_SELF {int(manifest['self'])}\n",
        f'#define TF_DATA_FILE "{data_file}"\n',
        _list("char *const", "tf_chain_names", [f'"{t["name"]}"' for t in chain]),
        _list("char *const", "tf_chain_files", [f'"{t["library"]}"' for t in chain]),
        _list("char *const", "tf_chain_flags", [f'"{" ".join(t["flags"])}"' for t in chain]),
    ])


def c_source(steps: dict[str, Any], manifest: dict[str, Any], data_digest64: str,
             data_bytes: int) -> str:
    """The C file compiled into the library: the program's tables, then the runtime."""
    flags, unknown = cpuinfo_flags(manifest["target"]["cpu_features"])
    if unknown:
        raise ArtifactError(f"the C runtime cannot check the CPU features {', '.join(unknown)}"
                            "; list them as unchecked_features")
    dims: list[int] = []

    def dims_at(shape: list[int], strides: list[int]) -> int:
        dims.extend([*shape, *strides])
        return len(dims) - len(shape) - len(strides)

    dtypes = list(DTYPES)
    symbols: list[str] = []
    entries = []
    for call in steps["calls"]:
        entries.append([3, len(symbols), 0])
        symbols.append(call["symbol"])
        for kind, value in call["args"]:
            a, b = (value if kind == "addr" else (value, 0))
            entries.append([_ARGS[kind], a, b])
    objects = [[*o["at"], len(o["shape"]), dims_at(o["shape"], o["strides"])]
               for o in steps["objects"]]
    state, *held_io = _state_tables(manifest, [(steps, 0, 0)])
    held = dict(zip(("inputs", "outputs"), held_io, strict=True))
    io = {}
    for side in ("inputs", "outputs"):
        io[side] = [[*ref["at"], dtypes.index(spec["dtype"]), len(spec["shape"]),
                     dims_at(spec["shape"], ref["strides"])]
                    for i, (spec, ref) in enumerate(zip(manifest[side], steps[side],
                                                        strict=True)) if i not in held[side]]
    externs = "".join(f'extern char tf_fn{i}[] __asm__("{s}");\n' for i, s in enumerate(symbols))
    counts = {"BUFFERS": len(steps["buffers"]), "POINTERS": len(steps["pointers"]),
              "OBJECTS": len(objects), "ENTRIES": len(entries),
              "INPUTS": len(io["inputs"]), "OUTPUTS": len(io["outputs"]),
              "STATUS": len(steps["status"]), "FLAGS": len(flags),
              "STATE": len(manifest.get("state", [])),
              "MAX_THREADS": manifest["pool"]["max_threads"], "DATA_BYTES": data_bytes,
              "HEADER_WORDS": HEADER_WORDS, **{f"HEADER_{k.upper()}": v // 8
                                               for k, v in HEADER.items()}}
    tables = "".join([
        "#include <stdint.h>\n",
        "".join(f"#define TF_N{k} {v}\n" if not k.startswith(("MAX", "DATA", "HEADER"))
                else f"#define TF_{k} {v}\n" for k, v in counts.items()),
        _rows("tf_buffers", [[_KINDS[b["kind"]], b["bytes"], b.get("offset", 0)]
                             for b in steps["buffers"]], 3),
        _rows("tf_pointers", [[*w, *t] for w, t in steps["pointers"]], 4),
        _rows("tf_objects", objects, 4),
        _rows("tf_entries", entries, 3),
        _rows("tf_inputs", io["inputs"], 5),
        _rows("tf_outputs", io["outputs"], 5),
        state,
        _chain_tables(manifest),
        _list("int64_t", "tf_dims", [str(d) for d in dims]),
        _list("int64_t", "tf_itemsize", [str(_ITEMSIZE[d]) for d in dtypes]),
        _list("int", "tf_status", [str(s) for s in steps["status"]]),
        _list("char *const", "tf_flags", [f'"{f}"' for f in flags]),
        f'static const char tf_target[] = "{manifest["target"]["name"]}";\n',
        f"static const uint64_t tf_data_digest64 = 0x{int(data_digest64, 16):016x}ULL;\n",
        externs,
        _list("void *const", "tf_functions", [f"(void *)tf_fn{i}" for i in range(len(symbols))]),
    ])
    return tables + "\n" + (source_dir() / "runtime.c").read_text()


class _Expressions:
    """The integers of a symbolic program as rows of `tf_exprs` (tag, a, b): a constant a,
    a + b*n for {"n": [a, b]}, or a table's value for n ({"t": [lo, ...]}: its values in
    `tf_tabvals` from a, for the sizes from b), each distinct one once."""

    def __init__(self, lo: int, hi: int):
        self.rows: list[list[int]] = []
        self.values: list[int] = []
        self._index: dict[tuple, int] = {}
        self.lo, self.hi = lo, hi

    def __call__(self, value: Any) -> int:
        if type(value) is int:
            key: tuple = (0, value, 0)
        elif isinstance(value, dict) and value.keys() == {"n"}:
            key = (1, *map(int, value["n"]))
        elif isinstance(value, dict) and value.keys() == {"t"}:
            first, *values = map(int, value["t"])
            if first > self.lo or first + len(values) - 1 < self.hi:
                raise ArtifactError(f"a size table from {first} of {len(values)} values does "
                                    f"not cover its class {self.lo}..{self.hi}")
            key = ("t", first, *values)
        else:
            raise ArtifactError(f"not an integer or a size formula: {value!r}")
        if key not in self._index:
            if key[0] == "t":
                row = [2, len(self.values), key[1]]
                self.values += key[2:]
            else:
                row = list(key)
            self._index[key] = len(self.rows)
            self.rows.append(row)
        return self._index[key]


def symbolic_c_source(program: dict[str, Any], manifest: dict[str, Any], data_digest64: str,
                      data_bytes: int) -> str:
    """The C file compiled into a symbolic artifact's library: every size class's program
    as tables whose integers are expressions of the size (`_Expressions`), then
    `data/aot/runtime_symbolic.c`."""
    from tilefold.aot.symbolic import evaluate

    flags, unknown = cpuinfo_flags(manifest["target"]["cpu_features"])
    if unknown:
        raise ArtifactError(f"the C runtime cannot check the CPU features {', '.join(unknown)}"
                            "; list them as unchecked_features")
    symbol, lo, hi = program["symbol"], program["min"], program["max"]
    dtypes = list(DTYPES)
    exprs = _Expressions(lo, hi)
    dims: list[int] = []  # expressions: an array's shape, then its strides
    symbols: list[str] = []
    tables: dict[str, list[list[int]]] = {name: [] for name in (
        "buffers", "pointers", "patches", "objects", "entries", "inputs", "outputs",
        "classes")}
    status: list[str] = []

    def dims_at(shape: list, strides: list) -> int:
        dims.extend(exprs(v) for v in (*shape, *strides))
        return len(dims) - len(shape) - len(strides)

    def buffer(number: Any, count: int) -> int:
        if type(number) is not int or not 0 <= number < count:
            raise ArtifactError(f"buffer {number!r} of a size class: not a buffer number")
        return number

    first, classes = 0, []  # each class's program, its first buffer, its smallest size
    for c in program["classes"]:
        classes.append((c["program"], first, c["lo"]))
        first += len(c["program"]["buffers"])
    state, *held_io = _state_tables(manifest, classes)
    held = dict(zip(("inputs", "outputs"), held_io, strict=True))
    given = [i for i in range(len(manifest["inputs"])) if i not in held["inputs"]]
    for c in program["classes"]:
        exprs.lo, exprs.hi = c["lo"], c["hi"]
        steps = c["program"]
        count = len(steps["buffers"])
        row = [c["lo"], c["hi"], len(tables["buffers"]), len(tables["pointers"]),
               len(steps["pointers"]), len(tables["patches"]), len(steps["patches"]),
               len(tables["objects"]), len(steps["objects"]), len(tables["entries"])]
        for b in steps["buffers"]:
            top = max(evaluate(b["bytes"], c["lo"]), evaluate(b["bytes"], c["hi"]))
            tables["buffers"].append([_KINDS[b["kind"]], top, b.get("offset", 0)])
        for where, to in steps["pointers"]:
            tables["pointers"].append([buffer(where[0], count), exprs(where[1]),
                                       buffer(to[0], count), exprs(to[1])])
        for b, offset, value in steps["patches"]:
            tables["patches"].append([buffer(b, count), exprs(offset), exprs(value)])
        for o in steps["objects"]:
            tables["objects"].append([buffer(o["at"][0], count), exprs(o["at"][1]),
                                      len(o["shape"]), dims_at(o["shape"], o["strides"])])
        entries = tables["entries"]
        for call in steps["calls"]:
            entries.append([3, len(symbols), 0])
            symbols.append(call["symbol"])
            for kind, value in call["args"]:
                if kind == "addr":
                    entries.append([1, buffer(value[0], count), exprs(value[1])])
                elif kind == "object":
                    entries.append([2, int(value), 0])
                else:
                    entries.append([0, exprs(value), 0])
        row.append(len(entries) - row[-1])
        row += [len(status), len(steps["status"])]
        status += [str(buffer(b, count)) for b in steps["status"]]
        tables["classes"].append(row)
        for side in ("inputs", "outputs"):
            for i, (spec, ref) in enumerate(zip(manifest[side], steps[side], strict=True)):
                if i in held[side]:
                    continue
                tables[side].append([buffer(ref["at"][0], count), exprs(ref["at"][1]),
                                     dtypes.index(spec["dtype"]), len(spec["shape"]),
                                     dims_at(ref["shape"], ref["strides"])])
    names = [symbol, *program.get("outer", [])]  # the fitted symbol, then those held at one
    symdims = [[given.index(i), d, names.index(size[1:])]  # the caller's input numbers
               for i, spec in enumerate(manifest["inputs"])
               for d, size in enumerate(spec["shape"])
               if isinstance(size, str) and size[1:] in names]
    at = [c.get("at", []) + [0] * (len(names) == 1) for c in program["classes"]]
    bounds = [[manifest["symbols"][name]["min"], manifest["symbols"][name]["max"]]
              for name in names]
    ranks = [len(spec["shape"]) for side in ("inputs", "outputs") for spec in manifest[side]]
    replays = [c["entry"] for c in program["classes"]]
    counts = {"NBUFFERS": len(tables["buffers"]), "NOBJECTS": len(tables["objects"]),
              "NENTRIES": len(tables["entries"]), "NCLASSES": len(replays),
              "NINPUTS": len(given), "NOUTPUTS": len(manifest["outputs"]) - len(held["outputs"]),
              "NSTATE": len(held["inputs"]),
              "NSYMDIMS": len(symdims), "NOUTER": len(names) - 1, "NFLAGS": len(flags),
              "MIN": lo, "MAX": hi,
              "MAX_RANK": max(ranks, default=0), "MAX_THREADS": manifest["pool"]["max_threads"],
              "DATA_BYTES": data_bytes, "HEADER_WORDS": HEADER_WORDS,
              **{f"HEADER_{k.upper()}": v // 8 for k, v in HEADER.items()}}
    externs = "".join(f'extern char tf_fn{i}[] __asm__("{s}");\n' for i, s in enumerate(symbols))
    text = "".join([
        "#include <stdint.h>\n",
        "".join(f"#define TF_{k} {v}\n" for k, v in counts.items()),
        _rows("tf_exprs", exprs.rows, 3),
        _list("int64_t", "tf_tabvals", [str(v) for v in exprs.values]),
        *(_rows(f"tf_{name}", rows, width) for name, rows, width in (
            ("classes", tables["classes"], 13), ("buffers", tables["buffers"], 3),
            ("pointers", tables["pointers"], 4), ("patches", tables["patches"], 3),
            ("objects", tables["objects"], 4), ("entries", tables["entries"], 3),
            ("inputs", tables["inputs"], 5), ("outputs", tables["outputs"], 5),
            ("symdims", symdims, 3), ("class_at", at, max(len(names) - 1, 1)),
            ("symbol_bounds", bounds, 2))),
        state,
        _chain_tables(manifest),
        _list("char *const", "tf_symbol_names", [f'"?{name}"' for name in names]),
        _list("int64_t", "tf_dims", [str(d) for d in dims]),
        _list("int64_t", "tf_itemsize", [str(_ITEMSIZE[d]) for d in dtypes]),
        _list("int64_t", "tf_status", status),
        _list("char *const", "tf_flags", [f'"{f}"' for f in flags]),
        f'static const char tf_target[] = "{manifest["target"]["name"]}";\n',
        f'static const char tf_symbol[] = "?{symbol}";\n',
        f"static const uint64_t tf_data_digest64 = 0x{int(data_digest64, 16):016x}ULL;\n",
        externs,
        _list("void *const", "tf_functions", [f"(void *)tf_fn{i}" for i in range(len(symbols))]),
        "".join(f"void {r}(int64_t *table);\n" for r in replays),
        _list("tf_replay_fn", "tf_replays", replays).replace(
            "static const tf_replay_fn", "typedef void (*tf_replay_fn)(int64_t *);\n"
            "static const tf_replay_fn"),
    ])
    return text + "\n" + (source_dir() / "runtime_symbolic.c").read_text()
