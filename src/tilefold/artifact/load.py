"""`tilefold.load(path)`: run an exported artifact with NumPy and ctypes alone (no LLVM, no
PyTorch, no compiling).

Everything is checked before any of the artifact's code runs: the manifest (format,
version, architecture, the CPU features its code assumes), each part's size and digest64
(data.bin's on its copy-on-write mapping, which the model then uses, by the library's own
digest64 once the library's digest is checked), and the step program's every buffer
reference. Then the other buffers are allocated, the pointers of the step
program written into one int64 table, and a call is: inputs checked and copied in,
`tf_replay(table)` (one native call running every kernel), outputs copied out.

An artifact exported with `donate` has *state*: those inputs (a KV cache) live in the loaded
model (`model.state`, zero at load), are written in place by each call and never copied; a
call takes and returns the other inputs and outputs only.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import ctypes
import itertools
import mmap
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from tilefold.artifact.cpu import host_arch, missing_features
from tilefold.artifact.format import (
    ALIGN,
    DATA,
    DIGEST,
    DTYPES,
    ENTRY,
    FORMAT,
    FORMAT_VERSION,
    HEADER,
    HEADER_WORDS,
    MANIFEST,
    PROGRAM,
    SIGNATURES,
    check_parts,
    digest64,
    digest64_file,
    part_files,
    read_json,
)
from tilefold.artifact.pool import env_int, pool_threads, worker_cpus
from tilefold.errors import ArtifactError, DTypeError, ShapeError, UnsupportedError
from tilefold.version import __version__

if TYPE_CHECKING:
    from tilefold.artifact.format import Where


def load(path: Where, target: str | None = None) -> LoadedModel:
    """The artifact `tilefold export` wrote at `path`, ready to call on NumPy arrays. For
    an artifact of a chain of targets, the first whose CPU features this host has runs
    (`model.manifest["target"]`); `target` names the one to take instead (checked all the
    same)."""
    root = os.fspath(path)
    if not os.path.isdir(root):
        raise ArtifactError(f"{root}: not an artifact directory (`tilefold export` writes one "
                            f"holding {MANIFEST}, {PROGRAM}, {DATA} and a kernels-*.so)")
    manifest = _pick_target(root, read_json(os.path.join(root, MANIFEST), "manifest"), target)
    _check_manifest(root, manifest)
    files = part_files(root, manifest)  # a chain's target with a plan of its own: its files
    data = _map(os.path.join(root, files["data"]))
    library = _checked_library(root, manifest)
    try:
        threads = pool_threads(DIGEST_THREADS)
        check_parts(root, manifest, {"data": data}, _native_digest(library, threads)
                    or (lambda buffer: digest64(buffer, threads)))
    except BaseException:
        _unload(library)  # a refused artifact leaves none of its code in the process
        if data is not None:
            _unmap(data)
        raise
    try:
        program = read_json(os.path.join(root, files["program"]), "step program")
        return LoadedModel(root, manifest, program, data)
    except BaseException:
        if data is not None:
            _unmap(data)
        raise


DIGEST_THREADS = 4  # at most, digesting data.bin (as many as the pool would have, up to this)


def _checked_library(root: str, manifest: dict[str, Any]) -> ctypes.CDLL | None:
    """The artifact's library, loaded once its size and digest64 are the manifest's (so it
    is the code the exporter wrote; none of it runs but `tf_digest64_parallel`), for digesting
    data.bin; None when it is not (`check_parts` then says why)."""
    try:
        entry = manifest["parts"]["library"]
        path = os.path.join(root, part_files(root, manifest)["library"])
        if os.stat(path).st_size != entry["bytes"] or digest64_file(path) != entry[DIGEST]:
            return None
        return ctypes.CDLL(os.path.realpath(path))
    except (OSError, KeyError, TypeError, ArtifactError):
        return None


def _unload(library: ctypes.CDLL | None) -> None:
    if library is not None:
        import _ctypes  # dlclose: CPython's, on every POSIX host

        _ctypes.dlclose(library._handle)


def _native_digest(library: ctypes.CDLL | None, threads: int) -> Any:
    """digest64 by the library's C code on up to `threads` threads of its own
    (`tf_digest64_parallel`, `digest64.h`: ~4x NumPy's), for `check_parts`; None (NumPy's)
    without it (exported before)."""
    try:
        function = library["tf_digest64_parallel"] if library is not None else None
    except AttributeError:
        return None
    if function is None:
        return None
    function.restype = ctypes.c_uint64
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def digest(buffer: Any) -> str:
        data = np.frombuffer(buffer, np.uint8)
        try:
            return f"{function(data.ctypes.data, data.nbytes, threads):016x}"
        finally:
            del data  # the mapping may be closed again (a refused artifact's)
    return digest


def _map(path: str) -> mmap.mmap | None:
    """`path` mapped copy-on-write (private pages: a kernel's writes never reach the file), or
    None when it is missing or empty (`check_parts` says which is wrong)."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, 2) == 0:
                return None
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot be mapped ({exc})") from None


def _unmap(data: mmap.mmap) -> None:
    """Unmap a refused artifact's data (its pages leave the process), unless an array that
    escaped still views it (then the mapping goes with that array)."""
    with contextlib.suppress(BufferError):
        data.close()


def _pick_target(root: str, manifest: dict[str, Any], name: str | None,
                 flags: frozenset[str] | None = None) -> dict[str, Any]:
    """The manifest as the target this host runs makes it: of a chain (`targets`, in order
    of preference), the first whose architecture and CPU features the host has (or the one
    `name`d), its description the `target` and its file the library part; `UnsupportedError`
    saying what each lacks when the host runs none. `flags`: another host's /proc/cpuinfo
    flags (`cpu.missing_features`; tests pick as an AVX-512 or AVX2 host would, and only
    `load`, on this host's own, runs what it picks)."""
    where, chain = os.path.join(root, MANIFEST), manifest.get("targets")
    if chain is None:
        given = manifest.get("target")
        if name is not None and (not isinstance(given, dict) or given.get("name") != name):
            raise ArtifactError(f"{root}: not exported for {name}")
        return manifest
    parts = manifest.get("parts")
    if not isinstance(chain, list) or not chain or not isinstance(parts, dict) or not all(
            isinstance(t, dict) and isinstance(t.get("cpu_features"), list)
            and isinstance(t.get("library"), dict)
            and _runs(t, "program", PROGRAM, parts) is not None
            and _runs(t, "data", DATA, parts) is not None for t in chain):
        raise ArtifactError(f"{where}: its targets must each list CPU features and a "
                            f"library, and run {PROGRAM} on {DATA} or a program and data "
                            "of their own")
    names = [t.get("name") for t in chain]
    if name is not None and name not in names:
        raise ArtifactError(f"{root}: not exported for {name} (its targets: "
                            f"{', '.join(map(str, names))})")
    why = []
    for t in chain if name is None else [chain[names.index(name)]]:
        missing = missing_features([str(f) for f in t["cpu_features"]], flags)
        if t.get("arch") != host_arch():
            why.append(f"{t.get('name')} is {t.get('arch')}")
        elif missing:
            why.append(f"{t.get('name')} uses {', '.join(missing)}")
        else:
            described = {k: v for k, v in t.items() if k not in ("library", "program", "data")}
            return {**manifest, "target": described, "parts": {
                "library": t["library"], "program": _runs(t, "program", PROGRAM, parts),
                "data": _runs(t, "data", DATA, parts)}}
    raise UnsupportedError(
        f"{root}: this host ({host_arch()}) runs none of the targets it was exported for: "
        f"{'; '.join(why)}; export it with a chain ending in a target this host has (e.g. "
        "--targets znver4,x86-64-v3)")


def _runs(member: dict[str, Any], part: str, shared: str, parts: dict[str, Any]) -> Any:
    """The part entry of the `part` a chain's member runs (its file, size and digests;
    `part_files` checks the file's name), None when it has none. A chain exported before
    members had plans of their own names the shared file, whose entry is in the parts."""
    given = member.get(part)
    if given == shared:
        return parts.get(part) if isinstance(parts.get(part), dict) \
            and parts[part].get("file") == shared else None
    return given if isinstance(given, dict) else None


def _check_manifest(root: str, manifest: dict[str, Any]) -> None:
    where = os.path.join(root, MANIFEST)
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{where}: not a tilefold artifact manifest (format "
                            f"{manifest.get('format')!r}, expected {FORMAT!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{where}: artifact format version {manifest.get('format_version')!r}; tilefold "
            f"{__version__} reads version {FORMAT_VERSION}: export it again with this tilefold")
    target = manifest.get("target")
    if not isinstance(target, dict) or not isinstance(target.get("cpu_features"), list):
        raise ArtifactError(f"{where}: the manifest names no target and its CPU features")
    if target.get("arch") != host_arch():
        raise UnsupportedError(f"{root}: exported for {target.get('arch')} "
                               f"({target.get('name')}); this host is {host_arch()}")
    missing = missing_features([str(f) for f in target["cpu_features"]])
    if missing:
        raise UnsupportedError(
            f"{root}: exported for {target.get('name')}, whose code uses CPU features this "
            f"host lacks: {', '.join(missing)}; export it for a target this host has "
            "(e.g. --target x86-64-v3) or run it on such a host")
    for side in ("inputs", "outputs"):
        specs = manifest.get(side)
        if not isinstance(specs, list) or not all(
                isinstance(s, dict) and s.get("dtype") in DTYPES and isinstance(s.get("shape"),
                                                                                 list)
                for s in specs):
            raise ArtifactError(f"{where}: {side} must each have a dtype of "
                                f"{', '.join(DTYPES)} and a shape")
    state = manifest.get("state", [])
    if not isinstance(state, list) or not all(
            isinstance(p, dict) and p.keys() == {"input", "output"}
            and type(p["input"]) is int and 0 <= p["input"] < len(manifest["inputs"])
            and type(p["output"]) is int and 0 <= p["output"] < len(manifest["outputs"])
            and all(type(d) is int for d in manifest["inputs"][p["input"]]["shape"])
            for p in state) or len({p["input"] for p in state}) != len(state):
        raise ArtifactError(f"{where}: its state must pair distinct inputs of static shape "
                            "with outputs")


def _workspace(sizes: list[int], into: np.ndarray | None = None) -> list[np.ndarray]:
    """Zeroed buffers of these sizes in one anonymous mapping, each `ALIGN`-aligned with
    `ALIGN` bytes to spare after it: its pages are made zero on first touch (nothing is
    cleared at load; as in the C runtime, no MADV_HUGEPAGE, whose compaction on fault slowed
    the first call). `into`: laid out from the start of that memory instead (at least
    `_extent(sizes)` bytes)."""
    offsets, at = [], 0
    for nbytes in sizes:
        if nbytes < 0:
            raise ValueError(f"a buffer of {nbytes} bytes")
        offsets.append(at)
        at += -(-(nbytes + ALIGN) // ALIGN) * ALIGN
    if at == 0:
        return [np.zeros(0, np.uint8) for _ in sizes]
    if into is None:
        mapped = mmap.mmap(-1, at, flags=mmap.MAP_PRIVATE)  # not shared: anonymous pages
        into = np.frombuffer(mapped, np.uint8)
    return [into[o:o + n] for o, n in zip(offsets, sizes, strict=True)]


def _extent(sizes: list[int]) -> int:
    """The bytes `_workspace(sizes)` lays its buffers out in."""
    return sum(-(-(max(0, n) + ALIGN) // ALIGN) * ALIGN for n in sizes)


class LoadedModel:
    """An artifact loaded into this process: `model(*arrays)` returns the list of outputs (fresh
    arrays); `inputs` and `outputs` describe them (name, dtype, shape)."""

    def __init__(self, root: str, manifest: dict[str, Any], program: dict[str, Any],
                 data: mmap.mmap | None):
        self.root = root
        files = part_files(root, manifest)
        self.library = os.path.join(root, files["library"])
        self.program_file = os.path.join(root, files["program"])
        self.manifest = manifest
        pairs = manifest.get("state", [])
        self._held = [p["input"] for p in pairs]  # state inputs, and the outputs they are
        held_out = {p["output"] for p in pairs}
        self._given = [i for i in range(len(manifest["inputs"])) if i not in self._held]
        self._returned = [i for i in range(len(manifest["outputs"])) if i not in held_out]
        self.inputs = [manifest["inputs"][i] for i in self._given]  # what a call takes
        self.outputs = [manifest["outputs"][i] for i in self._returned]  # and returns
        self.state: list[np.ndarray] = []  # the state inputs' arrays, in the manifest's order
        self._lock = _thread.allocate_lock()  # threading's Lock, without importing threading
        self._data = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8)
        try:
            self._prepare(program)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{self.program_file}: malformed step program ({exc!r}); export "
                                "the artifact again") from None

    def _prepare(self, program: dict[str, Any]) -> None:
        if "classes" in program:
            self._prepare_symbolic(program)
            return
        self._symbolic = None
        specs = program["buffers"]
        others = iter(_workspace([int(b["bytes"]) for b in specs if b["kind"] != "data"]))
        self.buffers = [self._constants(b) if b["kind"] == "data" else next(others)
                        for b in specs]
        self._library = self._open()
        self._bound = self._bind(program, ENTRY, SIGNATURES,
                                 [s["shape"] for s in self.manifest["inputs"]],
                                 [s["shape"] for s in self.manifest["outputs"]])
        self.state = [self._bound.inputs[i] for i in self._held]

    def _bind(self, program: dict[str, Any], entry: str, signatures_name: str,
              input_shapes: list, output_shapes: list) -> _Bound:
        """The table, headers and views of `program` (every integer known) on `self.buffers`,
        its pointer words written."""
        bound = _Bound()
        for where, to in program["pointers"]:  # words of parameter blocks holding addresses
            word = self._address(where, 8)
            bound.pointers.append((word, self._address(to)))
            ctypes.c_int64.from_address(word).value = bound.pointers[-1][1]
        for buffer, offset, value in program.get("patches", ()):  # sizes in parameter blocks
            if type(value) is not int or not -(1 << 63) <= value < 1 << 63:
                raise ValueError(f"patch value {value!r}")
            word = self._address([buffer, offset], 8)
            bound.pointers.append((word, value))
            ctypes.c_int64.from_address(word).value = value
        self._headers = bound.headers = [self._header(h) for h in program["objects"]]
        calls = program["calls"]
        signatures = [str(call["signature"]) for call in calls]
        self._check_signatures(signatures, signatures_name)
        table: list[int] = []
        for call, signature in zip(calls, signatures, strict=True):
            if len(call["args"]) != len(signature):
                raise ValueError(f"{call['symbol']} takes {len(signature)} arguments")
            table.append(self._symbol(str(call["symbol"])))
            table += [self._argument(letter, kind, value)
                      for letter, (kind, value) in zip(signature, call["args"], strict=True)]
        bound.table = np.array(table or [0], np.int64)
        bound.table_address = bound.table.ctypes.data
        bound.inputs = [self._view(spec, shape, ref) for spec, shape, ref in
                        zip(self.manifest["inputs"], input_shapes, program["inputs"],
                            strict=True)]
        bound.results = [self._view(spec, shape, ref) for spec, shape, ref in
                         zip(self.manifest["outputs"], output_shapes, program["outputs"],
                             strict=True)]
        bound.status = [self._buffer_at(i)[:8].view(np.int64) for i in program["status"]]
        bound.run = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self._symbol(entry))
        return bound

    def _prepare_symbolic(self, program: dict[str, Any]) -> None:
        """Size classes (`aot/symbolic.py`): each class's buffers allocated for its largest
        size, its program checked at its smallest and largest (every reference is linear in
        the size) and bound again, checked, at each size a call brings."""
        symbol, lo, hi = program["symbol"], program["min"], program["max"]
        outer = program.get("outer", [])  # symbols each class holds at one size (`at`)
        declared = self.manifest.get("symbols")
        if not isinstance(declared, dict) or not isinstance(declared.get(symbol), dict) \
                or [declared[symbol].get(k) for k in ("min", "max")] != [lo, hi] \
                or type(lo) is not int or type(hi) is not int or not isinstance(outer, list) \
                or set(declared) != {symbol, *outer} or len(outer) != len(set(outer)) \
                or not all(isinstance(declared[o], dict) for o in outer):
            raise ValueError("the manifest's symbols and the program's bounds differ")
        sizes = declared[symbol].get("sizes", list(range(lo, hi + 1)))
        listed = {o: declared[o].get("sizes", list(range(declared[o]["min"],
                                                             declared[o]["max"] + 1)))
                  for o in outer}
        self._symbolic = (str(symbol), sizes, listed)
        self._library = self._open()
        self._classes: list[_Class] = []
        specs = self.manifest["inputs"]
        state = iter(_workspace([int(np.prod(specs[i]["shape"]))
                                 * np.dtype(DTYPES[specs[i]["dtype"]]).itemsize
                                 for i in self._held]))
        self.state = [np.ndarray(specs[i]["shape"], DTYPES[specs[i]["dtype"]], next(state))
                      for i in self._held]
        covered: dict[tuple, list[int]] = {at: [] for at in itertools.product(
            *listed.values())}  # per size of the other symbols: the sizes its classes hold
        needs: list[list[int]] = []  # each class's buffers' bytes, at its largest size
        for spec in program["classes"]:
            c = _Class(spec)
            held = covered.get(c.at)
            if held is None or c.hi < c.lo or (held and c.lo <= held[-1]):
                raise ValueError("size classes out of order")
            held += range(c.lo, c.hi + 1)
            needs.append([max(_evaluate(b["bytes"], c.lo), _evaluate(b["bytes"], c.hi))
                          for b in c.program["buffers"]])
            self._classes.append(c)
        if any(held != sizes for held in covered.values()):
            raise ValueError(f"size classes do not cover the sizes {sizes} once each")
        # One call runs one class, and workspace never outlives a call: every class's
        # workspace buffers lie in one memory, as large as the largest class needs.
        shared = _workspace([max(_extent([n for n, b in zip(need, c.program["buffers"],
                                                              strict=True)
                                            if b["kind"] == "workspace"])
                                 for need, c in zip(needs, self._classes, strict=True))])
        for c, need in zip(self._classes, needs, strict=True):
            kinds = [b["kind"] for b in c.program["buffers"]]
            work = iter(_workspace([n for n, k in zip(need, kinds, strict=True)
                                    if k == "workspace"], shared[0]))
            others = iter(_workspace([n for n, k in zip(need, kinds, strict=True)
                                      if k not in ("data", "workspace")]))
            c.buffers = [self._constants(b) if b["kind"] == "data" else
                         next(work) if b["kind"] == "workspace" else next(others)
                         for b in c.program["buffers"]]
            for i, array in zip(self._held, self.state, strict=True):  # one state, every class
                number, offset = _evaluate(c.program["inputs"][i]["at"], c.lo)
                if offset != 0 or need[number] != array.nbytes:
                    raise ValueError(f"state input {i} is not a buffer of its own")
                c.buffers[number] = array.reshape(-1).view(np.uint8)
        for c in self._classes:
            for n in sorted({c.lo, c.hi}):
                self._bound_at(c, n)

    def _bound_at(self, c: _Class, n: int) -> _Bound:
        bound = c.bound.get(n)
        if bound is None:
            steps = _evaluate(c.program, n)
            self.buffers = c.buffers
            bound = self._bind(steps, c.entry, c.signatures,
                               [r["shape"] for r in steps["inputs"]],
                               [r["shape"] for r in steps["outputs"]])
            c.current = bound
            c.bound[n] = bound
            while len(c.bound) > BOUND_PER_CLASS:
                c.bound.pop(next(iter(c.bound)))
        if c.current is not bound:  # parameter blocks point where this size's program reads
            for word, value in bound.pointers:
                ctypes.c_int64.from_address(word).value = value
            c.current = bound
        return bound

    def _buffer_at(self, number: Any) -> np.ndarray:
        if type(number) is not int or not 0 <= number < len(self.buffers):
            raise ValueError(f"no buffer {number!r}")
        return self.buffers[number]

    def _address(self, ref: Any, size: int = 0) -> int:
        """The address of (buffer, offset), `size` bytes from there inside the buffer."""
        number, offset = ref
        buffer = self._buffer_at(number)
        if type(offset) is not int or not 0 <= offset <= buffer.nbytes - size:
            raise ValueError(f"offset {offset!r} (+{size}) outside buffer {number}")
        return buffer.ctypes.data + offset

    def _argument(self, letter: str, kind: str, value: Any) -> int:
        """A table entry: an integer (a float's bits), an address, an array header."""
        if kind == "value" and type(value) is int and (letter != "p" or value == 0):
            if not -(1 << 63) <= value < 1 << 63:
                raise ValueError(f"argument {value} does not fit 64 bits")
            return value
        if letter == "p" and kind == "addr":
            return self._address(value)
        if letter == "p" and kind == "object" and type(value) is int and \
                0 <= value < len(self._headers):
            return self._headers[value].ctypes.data
        raise ValueError(f"argument {[kind, value]!r} for a parameter of kind {letter!r}")

    def _check_signatures(self, signatures: list[str], name: str = SIGNATURES) -> None:
        try:
            text = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(self._library,
                                                                           name)))
        except ValueError:
            text = None
        if text != "|".join(signatures).encode():
            raise ArtifactError(f"{self.library} was not exported with {self.program_file} "
                                "(their call signatures differ); export the artifact again")

    def _constants(self, spec: dict[str, Any]) -> np.ndarray:
        nbytes = int(spec["bytes"])
        offset = int(spec["offset"])
        if offset % ALIGN or offset < 0 or offset + nbytes > self._data.nbytes:
            raise ValueError(f"constant buffer at {offset} (+{nbytes}) outside {DATA}")
        return self._data[offset:offset + nbytes]

    def _header(self, spec: dict[str, Any]) -> np.ndarray:
        """What a kernel reads of a NumPy array object: data pointer, rank, dims, strides."""
        shape, strides = list(map(int, spec["shape"])), list(map(int, spec["strides"]))
        if len(shape) != len(strides):
            raise ValueError(f"array header {spec!r}: as many strides as dims")
        header = np.zeros(HEADER_WORDS + 2 * len(shape), np.int64)
        header[HEADER_WORDS:HEADER_WORDS + len(shape)] = shape
        header[HEADER_WORDS + len(shape):] = strides
        base = header.ctypes.data
        header[HEADER["data"] // 8] = self._address(spec["at"])
        header[HEADER["nd"] // 8] = len(shape)
        header[HEADER["dims"] // 8] = base + 8 * HEADER_WORDS
        header[HEADER["strides"] // 8] = base + 8 * (HEADER_WORDS + len(shape))
        return header

    def _view(self, spec: dict[str, Any], shape: list, ref: dict[str, Any]) -> np.ndarray:
        number, offset = ref["at"]
        buffer = self._buffer_at(number)
        dtype = np.dtype(DTYPES[spec["dtype"]])
        shape, strides = tuple(map(int, shape)), tuple(map(int, ref["strides"]))
        if type(offset) is not int or len(shape) != len(strides):
            raise ValueError(f"array view {ref!r}")
        reach = [(n - 1) * s for n, s in zip(shape, strides, strict=True)]
        low = offset + sum(min(0, r) for r in reach)
        high = offset + sum(max(0, r) for r in reach) + dtype.itemsize
        if 0 not in shape and not (low >= 0 and high <= buffer.nbytes):
            raise ValueError(f"array view at {ref} outside its buffer")
        return np.ndarray(shape, dtype, buffer=buffer, offset=offset, strides=strides)

    def _open(self) -> ctypes.CDLL:
        try:
            library = ctypes.CDLL(os.path.realpath(self.library))
        except OSError as exc:
            raise ArtifactError(f"{self.library}: cannot be loaded ({exc})") from None
        try:  # true once per library, whichever runtime (this one or C) asks
            claim = library["tf_claim_pool"]
        except AttributeError:
            raise ArtifactError(f"{self.library} lacks tf_claim_pool: not a library "
                                "`tilefold export` wrote; export the artifact again") from None
        claim.restype = ctypes.c_int
        if self.manifest.get("pool") and claim():
            self._start_pool(library)
        return library

    def _symbol(self, name: str) -> int:
        try:
            return ctypes.cast(self._library[name], ctypes.c_void_p).value
        except AttributeError:
            raise ArtifactError(f"{self.library} has no function {name!r} that the "
                                "step program calls; export the artifact again") from None

    def _start_pool(self, library: ctypes.CDLL) -> None:
        """The library's own native worker pool, started like the process's."""
        init = library["tilefold_pool_init"]
        init.restype = ctypes.c_int32
        if init() != 0:
            raise UnsupportedError("pthread_key_create failed; too many thread keys")
        start = library["tilefold_pool_start"]
        start.restype = ctypes.c_int32
        start.argtypes = [ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        size = pool_threads(int(self.manifest["pool"]["max_threads"]))
        cpus, worker_set = worker_cpus(size)
        spin_ns = env_int("TILEFOLD_SPIN_US", 2000, 0) * 1000
        start(size, ctypes.addressof(cpus), ctypes.addressof(worker_set), spin_ns)
        stop = library["tilefold_pool_stop"]
        stop.restype = None
        atexit.register(stop)

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        if len(arrays) != len(self.inputs):
            names = ", ".join(s["name"] for s in self.inputs)
            held = f" besides the {len(self._held)} of its state" if self._held else ""
            raise ShapeError(f"{self.root}: takes {len(self.inputs)} inputs ({names}){held}, "
                             f"got {len(arrays)}")
        given = [np.asarray(a) for a in arrays]
        for spec, a in zip(self.inputs, given, strict=True):
            if a.dtype != np.dtype(DTYPES[spec["dtype"]]):
                raise DTypeError(f"{self.root}: input %{spec['name']} must be {spec['dtype']} "
                                 f"({np.dtype(DTYPES[spec['dtype']])}), got {a.dtype}; convert "
                                 "it with .astype")
        with self._lock:
            if self._symbolic is None:
                bound = self._bound
                for spec, buffer, a in zip(self.inputs, _of(bound.inputs, self._given), given,
                                           strict=True):
                    if a.shape != buffer.shape:
                        raise ShapeError(f"{self.root}: input %{spec['name']} must have shape "
                                         f"{list(buffer.shape)} (exported for static shapes), "
                                         f"got {list(a.shape)}")
            else:
                c, n = self._class_of(given)
                try:
                    bound = self._bound_at(c, n)
                except (KeyError, IndexError, TypeError, ValueError) as exc:
                    raise ArtifactError(f"{self.program_file}: malformed step program at "
                                        f"size {n} ({exc!r}); export the artifact again") \
                        from None
            for buffer, a in zip(_of(bound.inputs, self._given), given, strict=True):
                np.copyto(buffer, a)
            bound.run(bound.table_address)
            for status in bound.status:
                if status[0]:
                    status[0] = 0
                    raise ShapeError("an index of a gather or index_put is out of range for "
                                     "its axis; check the indices")
            return [r.copy() for r in _of(bound.results, self._returned)]

    def _class_of(self, given: list[np.ndarray]) -> tuple[_Class, int]:
        """The sizes of the symbolic dims these inputs give, checked, the class holding them
        and the size of the one it fits."""
        symbol, sizes, outer = self._symbolic  # type: ignore[misc]
        values: dict[str, int] = {}
        for spec, a in zip(self.inputs, given, strict=True):
            shape = spec["shape"]
            text = "[" + ", ".join(map(str, shape)) + "]"
            if a.ndim != len(shape):
                raise ShapeError(f"{self.root}: input %{spec['name']} must have shape {text} "
                                 f"(rank {len(shape)}), got {list(a.shape)}")
            for d, size in zip(shape, a.shape, strict=True):
                name = d[1:] if isinstance(d, str) and d[1:] in (symbol, *outer) else None
                if name is not None:
                    if values.setdefault(name, size) != size:
                        raise ShapeError(f"{self.root}: ?{name} is {values[name]} in one input "
                                         f"and {size} in %{spec['name']}")
                elif d != size:
                    raise ShapeError(f"{self.root}: input %{spec['name']} must have shape "
                                     f"{text}, got {list(a.shape)}")
        for name, listed in ((*outer.items(), (symbol, sizes))):
            n = values.get(name)
            if n not in listed:
                exported = f"{listed[0]} to {listed[-1]}" \
                    if len(listed) == listed[-1] - listed[0] + 1 else ", ".join(map(str, listed))
                raise ShapeError(f"{self.root}: ?{name} = {n} is not a size this artifact was "
                                 f"exported for ({exported}); export it again with sizes that "
                                 f"hold it (dynamic_shapes={{'{name}': (min, max)}} or a list)")
        n = values[symbol]
        at = tuple(values[o] for o in outer)
        c = next(c for c in self._classes if c.at == at and c.lo <= n <= c.hi)
        return c, n


def _of(arrays: list[np.ndarray], numbers: list[int]) -> list[np.ndarray]:
    return [arrays[i] for i in numbers]


BOUND_PER_CLASS = 8  # programs bound per size class, most recent kept (each a table, headers)


class _Bound:
    """One program bound to buffers: its table, headers, input and output views, status
    words, replay entry, and the pointer words it wrote (written again when it comes back)."""

    def __init__(self) -> None:
        self.pointers: list[tuple[int, int]] = []
        self.headers: list[np.ndarray] = []
        self.table = np.zeros(1, np.int64)
        self.table_address = 0
        self.inputs: list[np.ndarray] = []
        self.results: list[np.ndarray] = []
        self.status: list[np.ndarray] = []
        self.run: Any = None


class _Class:
    """A size class of a symbolic artifact: sizes lo..hi, one fitted program."""

    def __init__(self, spec: dict[str, Any]):
        self.lo, self.hi = spec["lo"], spec["hi"]
        if type(self.lo) is not int or type(self.hi) is not int:
            raise ValueError(f"size class {self.lo!r}..{self.hi!r}")
        self.at = tuple(spec.get("at", ()))  # the sizes of the program's other symbols
        if not all(type(v) is int for v in self.at):
            raise ValueError(f"size class at {self.at!r}")
        self.program: dict[str, Any] = spec["program"]
        self.entry, self.signatures = str(spec["entry"]), str(spec["signatures"])
        if not (self.entry.startswith(ENTRY) and self.signatures.startswith(SIGNATURES)):
            raise ValueError(f"size class entry {self.entry!r}")
        self.buffers: list[np.ndarray] = []
        self.bound: dict[int, _Bound] = {}
        self.current: _Bound | None = None


def _evaluate(t: Any, n: int) -> Any:
    """A class's program at size n: each {"n": [c, k]} is c + k*n, each {"t": [lo, ...]}
    the table's value for n (`aot/symbolic.py`)."""
    if isinstance(t, dict):
        if t.keys() == {"n"}:
            c, k = t["n"]
            if type(c) is not int or type(k) is not int:
                raise ValueError(f"size formula {t!r}")
            return c + k * n
        if t.keys() == {"t"}:  # one value per size, from the class's first
            table = t["t"]
            if not isinstance(table, list) or not 1 <= 1 + n - table[0] < len(table):
                raise ValueError(f"size table {t!r} has no value for size {n}")
            return table[1 + n - table[0]]
        return {key: _evaluate(v, n) for key, v in t.items()}
    if isinstance(t, list):
        return [_evaluate(v, n) for v in t]
    return t
