"""Each layer of src/tilefold imports only the layers before it, as docs/ARCHITECTURE.md lists them,
and the modules within a layer import each other without cycles.

The layer table is read from the document itself, so the map and the code cannot drift apart:
a new package needs a row there before its imports can be checked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tilefold"
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def documented_layers() -> dict[str, int]:
    """Package -> layer number, from the `| # | package | ... |` table and `sits beside` lines."""
    layers: dict[str, int] = {}
    text = DOC.read_text()
    for number, packages in re.findall(r"^\|\s*(\d+)\s*\|([^|]*)\|", text, re.MULTILINE):
        for name in re.findall(r"`tilefold\.(\w+)`", packages):
            layers[name] = int(number)
    for name, beside in re.findall(r"`tilefold\.(\w+)`[^\n]*?sits beside `(\w+)`", text):
        layers[name] = layers[beside]
    return layers


LAYERS = documented_layers()


def top_level(path: Path) -> str:
    """The package or module of src/tilefold that `path` belongs to (`__init__` for the root)."""
    first = path.relative_to(SRC).parts[0]
    return first.removesuffix(".py")


def source_files() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def imported_names(path: Path) -> set[str]:
    """Every name `path` imports, at any depth, as a full dotted name (`from a.b import c` is
    `a.b.c`; relative imports resolved)."""
    package = ["tilefold", *path.relative_to(SRC).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names = [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(names)
    return found


def imported_tops(path: Path) -> set[str]:
    """The top-level tilefold packages `path` imports (absolute or relative, at any depth)."""
    return {parts[1] for parts in (n.split(".") for n in imported_names(path))
            if parts[0] == "tilefold" and len(parts) > 1}


def test_the_document_lists_the_layers() -> None:
    assert LAYERS["errors"] == 0 and LAYERS["ir"] < LAYERS["passes"] < LAYERS["cli"], LAYERS


def test_every_package_has_a_layer() -> None:
    missing = sorted({top_level(p) for p in source_files()} - set(LAYERS) - {"__init__"})
    assert not missing, (
        f"add a row (or a 'sits beside' line) to the layer table of docs/{DOC.name} for: "
        + ", ".join(f"tilefold.{m}" for m in missing)
    )


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_go_only_to_earlier_layers(path: Path) -> None:
    """Checked between documented layers; the test above names the undocumented ones."""
    top = top_level(path)
    if top not in LAYERS:  # the public surface (`__init__`) sits above every layer
        return
    upward = sorted(t for t in imported_tops(path) if LAYERS.get(t, -1) > LAYERS[top])
    assert not upward, f"tilefold.{top} (layer {LAYERS[top]}) imports " + ", ".join(
        f"tilefold.{t} (layer {LAYERS[t]})" for t in upward
    )


def module_name(path: Path) -> str:
    """`tilefold.codegen.llvm.lowp.dotpack` for src/tilefold/codegen/llvm/lowp/dotpack.py (a
    package's `__init__.py` is the package)."""
    parts = ["tilefold", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in source_files()}


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def module_imports(path: Path) -> dict[str, bool]:
    """The tilefold modules `path` imports at module level -> whether only for typing.

    Module level means the module body and the blocks in it (`if`, `try`, `with`), including
    `if TYPE_CHECKING:` (such an import is marked typing-only): an import that annotations need
    is still a dependency, and a guard that hides a cycle from the interpreter hides it from
    the reader too. Imports inside function bodies run late and are not counted. `from P import
    x` goes to module `P.x` when there is one, else to `P` itself (its `__init__`)."""
    this = module_name(path)
    package = this.split(".") if path.name == "__init__.py" else this.split(".")[:-1]
    found: dict[str, bool] = {}

    def add(name: str, typing_only: bool) -> None:
        if name in MODULES and name != this:
            found[name] = found.get(name, True) and typing_only

    def visit(nodes: list[ast.stmt], typing_only: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, typing_only)
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    add(sub if sub in MODULES else module, typing_only)
            elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                guarded = typing_only or _is_type_checking(node)
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, []), guarded)

    visit(ast.parse(path.read_text(), str(path)).body, False)
    return found


def runtime_cycles(edges: dict[str, dict[str, bool]]) -> list[list[str]]:
    """Groups of modules that import each other in a cycle with at least one import needed at
    run time (Tarjan's strongly connected components of `edges`: module -> {imported module:
    typing only}; inside such a group every import lies on a cycle).

    Modules that refer to each other's types only (`if TYPE_CHECKING:` both ways, such as
    tilefold.ir.core's Operation and tilefold.ir.opdef's OpDef) need neither loaded first, so
    a cycle made only of such imports is accepted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for v in edges:
        if v not in index:
            connect(v)
    return [g for g in groups
            if any(not typing for v in g for w, typing in edges[v].items() if w in g)]


def same_layer_edges() -> dict[str, dict[str, bool]]:
    """Module-level imports between modules of the same top-level package (a layer); imports
    across layers are the business of the test above."""
    return {m: {t: typing for t, typing in module_imports(p).items()
                if t.split(".")[1] == m.split(".")[1]}
            for m, p in MODULES.items() if m.count(".")}


def test_no_import_cycles_within_a_layer() -> None:
    cycles = runtime_cycles(same_layer_edges())
    assert not cycles, "modules importing each other in a cycle (make one not need the other, "\
        "or move what both need into a third module): " + "; ".join(
            " <-> ".join(group) for group in cycles)


def test_a_cycle_hidden_behind_type_checking_is_found() -> None:
    """How lowp's amxrun <-> dotpack once hid theirs: one import at run time, one for typing."""
    hidden = {"x.a": {"x.b": False}, "x.b": {"x.c": False}, "x.c": {"x.a": True}, "x.d": {}}
    assert runtime_cycles(hidden) == [["x.a", "x.b", "x.c"]]
    annotations_only = {"x.a": {"x.b": True}, "x.b": {"x.a": True}}
    assert runtime_cycles(annotations_only) == []
    # and the reader sees the guard: ir.core imports ir.opdef for its annotations only
    assert module_imports(SRC / "ir" / "core.py")["tilefold.ir.opdef"] is True
    assert module_imports(SRC / "codegen" / "llvm" / "lowp" / "dotpack.py")[
        "tilefold.codegen.llvm.lowp.driver"] is False


def imports_llvmlite(path: Path) -> bool:
    return any(name.split(".")[0] == "llvmlite" for name in imported_names(path))


def test_no_strategy_or_frontend_module_imports_llvmlite() -> None:
    """Code generation lives in tilefold.codegen (behind its backends): the kernel methods
    and the frontend call codegen functions and never build LLVM IR themselves."""
    offenders = sorted(
        str(p.relative_to(SRC)) for p in source_files()
        if top_level(p) in ("strategy", "frontend") and imports_llvmlite(p)
    )
    assert not offenders, f"move the LLVM code of {offenders} into tilefold.codegen"


CODEGEN = SRC / "codegen"
# A backend registers in codegen/backend/<name>.py and keeps its parts in codegen/<name>/.
BACKENDS = sorted(p.stem for p in (CODEGEN / "backend").glob("*.py")
                  if p.stem not in ("__init__", "base") and (CODEGEN / p.stem).is_dir())


def backend_of(path: Path) -> str | None:
    """The backend whose code `path` is (its package, or its file in codegen/backend/)."""
    parts = path.relative_to(CODEGEN).with_suffix("").parts
    if parts[0] in BACKENDS:
        return parts[0]
    return parts[1] if parts[0] == "backend" and parts[1] in BACKENDS else None


def backend_named(name: str) -> str | None:
    """The backend whose package holds the imported name `name`, if any."""
    parts = name.split(".")
    return parts[2] if parts[:2] == ["tilefold", "codegen"] and len(parts) > 2 \
        and parts[2] in BACKENDS else None


def codegen_files() -> list[Path]:
    return [p for p in source_files() if CODEGEN in p.parents]


def test_the_backends_are_found() -> None:
    assert {"llvm", "triton"} <= set(BACKENDS), BACKENDS


def test_target_neutral_codegen_imports_no_backend() -> None:
    """The kernel IR, the lowering table, row programs and GEMM blocking are read by every
    backend and name none (codegen/backend/__init__.py, which registers them all, aside)."""
    offenders = sorted(
        f"{p.relative_to(SRC)} imports {name}"
        for p in codegen_files()
        if backend_of(p) is None and p != CODEGEN / "backend" / "__init__.py"
        for name in imported_names(p) if backend_named(name)
    )
    assert not offenders, "move the backend's part behind its Backend: " + "; ".join(offenders)


def test_a_backend_imports_no_other_backend() -> None:
    offenders = sorted(
        f"{p.relative_to(SRC)} imports {name}"
        for p in codegen_files() if (mine := backend_of(p))
        for name in imported_names(p) if backend_named(name) not in (None, mine)
    )
    assert not offenders, "; ".join(offenders)


def test_only_the_llvm_backend_imports_llvmlite_in_codegen() -> None:
    offenders = sorted(str(p.relative_to(SRC)) for p in codegen_files()
                       if backend_of(p) != "llvm" and imports_llvmlite(p))
    assert not offenders, f"move the LLVM code of {offenders} into tilefold.codegen.llvm"
