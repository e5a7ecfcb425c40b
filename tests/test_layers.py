"""The package's folders are its architecture: each layer imports only the layers below it.

Every import counts, function-level and ``TYPE_CHECKING`` ones included, so
a late import cannot hide an upward dependency or a cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "ckpt_tool"

# Lowest first. A module may import its own layer (without cycles) or any layer below.
LAYERS: list[tuple[str, set[str]]] = [
    ("vocabulary", {"errors", "model", "dtypes", "limits", "units", "version", "format_names", "progress"}),
    ("io", {"io"}),
    ("pickles", {"pickles"}),
    ("formats", {"formats"}),
    ("keys", {"keys"}),
    ("tensors", {"tensors"}),
    ("writers", {"writers"}),
    ("commands", {"commands"}),
    ("render", {"render"}),
    ("cli", {"cli"}),
    ("api", {"__init__", "__main__", "api"}),
]
MAX_LINES = 400


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for index, (_, members) in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{module} belongs to no layer: add its folder to LAYERS in {__file__}")


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every ckpt_tool module that ``module`` imports, wherever the import stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "ckpt_tool")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "ckpt_tool":
                target = node.module
            else:
                continue
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known)
    return {m for m in found if m in known and m != module}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(m, p, known) for m, p in mods.items()}


def test_every_module_belongs_to_a_layer():
    for module in _modules():
        _layer(module)


def test_no_upward_import():
    upward = []
    for module, deps in _graph().items():
        for dep in deps:
            if dep == "ckpt_tool":
                continue  # the package itself is imported by every submodule; it names only version/API
            if _layer(dep) > _layer(module):
                upward.append(f"{module} ({LAYERS[_layer(module)][0]}) imports {dep} ({LAYERS[_layer(dep)][0]})")
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_no_import_cycle():
    graph = {m: {d for d in deps if d != "ckpt_tool"} for m, deps in _graph().items()}
    # Packages import their __init__ implicitly; a package's __init__ importing its own children is fine
    # as long as no child imports back into it, which the graph below sees as a cycle.
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_no_god_module(path: Path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PKG)} has {lines} lines: split it by topic"


def test_the_layer_checks_can_fail(tmp_path: Path):
    """The checker itself sees a function-level upward import (guards against a test that cannot fail)."""
    fake = tmp_path / "ckpt_tool" / "io" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from ..commands import scan\n")
    assert _imports("ckpt_tool.io.x", fake, {"ckpt_tool.commands", "ckpt_tool.commands.scan"}) == {
        "ckpt_tool.commands", "ckpt_tool.commands.scan"}
    assert _layer("ckpt_tool.commands.scan") > _layer("ckpt_tool.io.x")
