"""The C ABI of an artifact (`data/aot/tilefold_model.h`): the step program written as C
arrays ahead of the C runtime (`data/aot/runtime.c`), compiled into the artifact's library,
so `tf_model_load`, `tf_model_run` and `tf_model_free` run the model with no Python."""

from __future__ import annotations

from importlib import resources
from typing import Any

from tilefold.artifact.cpu import cpuinfo_flags
from tilefold.artifact.format import DTYPES, HEADER, HEADER_WORDS
from tilefold.errors import ArtifactError

HEADER_FILE = "tilefold_model.h"
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
    io = {}
    for side in ("inputs", "outputs"):
        io[side] = [[*ref["at"], dtypes.index(spec["dtype"]), len(spec["shape"]),
                     dims_at(spec["shape"], ref["strides"])]
                    for spec, ref in zip(manifest[side], steps[side], strict=True)]
    externs = "".join(f'extern char tf_fn{i}[] __asm__("{s}");\n' for i, s in enumerate(symbols))
    counts = {"BUFFERS": len(steps["buffers"]), "POINTERS": len(steps["pointers"]),
              "OBJECTS": len(objects), "ENTRIES": len(entries),
              "INPUTS": len(io["inputs"]), "OUTPUTS": len(io["outputs"]),
              "STATUS": len(steps["status"]), "FLAGS": len(flags),
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
