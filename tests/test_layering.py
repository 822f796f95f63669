"""Each layer of src/tilefold imports only the layers before it, as docs/ARCHITECTURE.md lists them.

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


def imported_tops(path: Path) -> set[str]:
    """The top-level tilefold packages `path` imports (absolute or relative, at any depth)."""
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
        for name in names:
            parts = name.split(".")
            if parts[0] == "tilefold" and len(parts) > 1:
                found.add(parts[1])
    return found


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


# Modules that still import llvmlite above codegen, each being moved into tilefold.codegen by
# its own change; delete an entry when its file moves (the test below then keeps it out).
LLVMLITE_ABOVE_CODEGEN_PENDING = {"strategy/kernels/rowprog.py"}


def imports_llvmlite(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name.split(".")[0] == "llvmlite" for name in names):
            return True
    return False


def test_no_strategy_or_frontend_module_imports_llvmlite() -> None:
    """Code generation lives in tilefold.codegen (behind its backends): the kernel methods
    and the frontend call codegen functions and never build LLVM IR themselves."""
    offenders = sorted(
        str(p.relative_to(SRC)) for p in source_files()
        if top_level(p) in ("strategy", "frontend") and imports_llvmlite(p)
    )
    unexpected = [p for p in offenders if p not in LLVMLITE_ABOVE_CODEGEN_PENDING]
    assert not unexpected, f"move the LLVM code of {unexpected} into tilefold.codegen"
