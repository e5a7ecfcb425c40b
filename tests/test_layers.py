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
    ("vocabulary", {"errors", "model", "dtypes", "limits", "units", "version", "format_names", "progress",
                    "exit_codes", "lazy"}),
    ("io", {"io"}),
    ("pickles", {"pickles"}),
    ("tensors", {"tensors"}),  # below formats: the --unsafe reader needs torch.load (tensors/data/trusted.py)
    ("formats", {"formats"}),
    ("keys", {"keys"}),
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


def _from_module(node: ast.ImportFrom, package: str) -> str | None:
    """The ckpt_tool module a ``from ... import`` reads from (relative ones resolved), None for another package."""
    if node.level:
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))
    if node.module and node.module.split(".")[0] == "ckpt_tool":
        return node.module
    return None


def _lazy_exports(path: Path) -> dict[str, str]:
    """name -> module of a package's lazy surface (its ``EXPORTS``, ckpt_tool/lazy.py); empty for a module."""
    if path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "EXPORTS" and node.value is not None:
            return {name: module for module, names in ast.literal_eval(node.value).items() for name in names}
    return {}


def _surface_only(node: ast.AST, tree: ast.Module) -> bool:
    """Whether ``node`` is a package's ``TYPE_CHECKING`` import of its own lazy surface (no import at run time)."""
    return any(isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING" and node in block.body
               for block in tree.body)


def _imports(module: str, path: Path, known: set[str], lazy: dict[str, dict[str, str]] | None = None) -> set[str]:
    """Every ckpt_tool module that ``module`` imports, wherever the import stands.

    A name taken from a package's lazy surface is an import of the module that defines it (what runs); the
    package's own ``TYPE_CHECKING`` list of that surface is no import of every module in it.
    """
    lazy = lazy or {}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "ckpt_tool")
        elif isinstance(node, ast.ImportFrom):
            target = _from_module(node, package)
            if target is None or (path.name == "__init__.py" and node.level == 1 and _surface_only(node, tree)):
                continue
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known)
            found.update(f"{target}.{lazy[target][a.name]}" for a in node.names if a.name in lazy.get(target, {}))
    return {m for m in found if m in known and m != module}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    lazy = {m: _lazy_exports(p) for m, p in mods.items()}
    return {m: _imports(m, p, known, lazy) for m, p in mods.items()}


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
                cycles.append([*stack[stack.index(dep):], dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# The torch/NumPy adapter: the only package that may import either (torch costs 1-2 s and 200 MiB).
ADAPTER = "ckpt_tool.tensors"
HEAVY = frozenset(["torch", "numpy"])
_IMPORTERS = frozenset(["__import__", "import_module"])  # __import__("torch"), importlib.import_module("numpy")


def _heavy_imports(path: Path) -> set[str]:
    """Each import of torch or NumPy in a file, as "line: what": statements wherever they stand
    (function-level and TYPE_CHECKING ones too) and calls of __import__/import_module with a literal
    name, also passed as a thread's target (``Thread(target=__import__, args=("torch",))``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            target = next((k.value for k in node.keywords if k.arg == "target"), None)
            by_target = isinstance(target, ast.Name) and target.id in _IMPORTERS
            if called in _IMPORTERS or by_target:
                literals = [a for a in ast.walk(node) if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                names = [a.value for a in literals]
        found.update(f"{node.lineno}: {n}" for n in names if n.split(".")[0] in HEAVY)
    return found



def _outside_adapter() -> dict[str, set[str]]:
    return {m: hits for m, p in _modules().items()
            if m != ADAPTER and not m.startswith(ADAPTER + ".") and (hits := _heavy_imports(p))}


def test_only_the_tensors_package_imports_torch_or_numpy():
    leaks = [f"{m} line {hit}" for m, hits in _outside_adapter().items() for hit in sorted(hits)]
    assert not leaks, "torch/NumPy imported outside ckpt_tool/tensors (move the code there):\n" + "\n".join(leaks)


def test_the_torch_check_can_fail(tmp_path: Path):
    """Every way the package has imported torch or NumPy is seen (guards against a test that cannot fail)."""
    fake = tmp_path / "x.py"
    fake.write_text(
        "from typing import TYPE_CHECKING\n"
        "import threading, importlib\n"
        "if TYPE_CHECKING:\n    import numpy as np\n"
        "def f():\n    import torch.distributed as td\n"
        "def g():\n    from numpy.lib import format\n"
        "def h():\n    return __import__('torch')\n"
        "def i():\n    return importlib.import_module('numpy')\n"
        "def j():\n    threading.Thread(target=__import__, args=('torch',)).start()\n"
        "def k():\n    import tomllib, os\n    from . import torch\n"
    )
    assert _heavy_imports(fake) == {"4: numpy", "6: torch.distributed", "8: numpy.lib", "10: torch",
                                    "12: numpy", "14: torch"}


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


# -- no feature package reaches into another's internals ------------------------------------------
# A name (module or attribute) starting with ``_`` is private to the package that holds it. Privates of
# ckpt_tool.formats.dcp.* may be used by ckpt_tool.formats.dcp.* (a feature's sub-packages count as
# the feature) and nowhere else; a layer package's own privates (ckpt_tool.formats._x) by its children.
KNOWN_PRIVATE_REACHES: set[str] = set()  # none left: keep it so


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_of(module: str, path: Path | None) -> str:
    return module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]


def _may_use_privates_of(importer_package: str, owner_package: str) -> bool:
    feature = ".".join(owner_package.split(".")[:3])  # ckpt_tool.<layer>.<feature>
    return importer_package == feature or importer_package.startswith(feature + ".")


def _bound(node: ast.AST, package: str, mods: dict[str, Path]) -> list[tuple[str, str | None]]:
    """(ckpt_tool name, the local name bound to it when that is a module) for each name an import binds."""
    if isinstance(node, ast.Import):
        return [(a.name, a.asname) for a in node.names if a.name.split(".")[0] == "ckpt_tool"]
    if not isinstance(node, ast.ImportFrom):
        return []
    target = _from_module(node, package)
    if target is None:
        return []
    return [(f"{target}.{a.name}", (a.asname or a.name) if f"{target}.{a.name}" in mods else None)
            for a in node.names]


def _private_reaches(module: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """``module: owner.private`` for each private name of another feature that ``module`` imports or uses."""
    package = _package_of(module, path)
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    aliases: dict[str, str] = {}  # local name -> the ckpt_tool module it is bound to

    def check(dotted: str) -> None:
        parts = dotted.split(".")
        for i in range(1, len(parts)):
            if _is_private(parts[i]):
                holder = ".".join(parts[:i])
                if not _may_use_privates_of(package, _package_of(holder, mods.get(holder))):
                    found.add(f"{module}: {dotted}")
                return

    for node in ast.walk(tree):
        for dotted, local in _bound(node, package, mods):
            check(dotted)
            if local:
                aliases[local] = dotted
    for node in ast.walk(tree):  # module._private, through a module bound by an import
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and _is_private(node.attr):
            check(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_no_feature_package_reaches_into_another_s_internals():
    mods = _modules()
    found: set[str] = set()
    for module, path in mods.items():
        found |= _private_reaches(module, path, mods)
    new = sorted(found - KNOWN_PRIVATE_REACHES)
    assert not new, "private names used outside their feature package (make them public, or move them):\n" + \
        "\n".join(new)
    cleared = sorted(KNOWN_PRIVATE_REACHES - found)
    assert not cleared, "fixed: remove from KNOWN_PRIVATE_REACHES:\n" + "\n".join(cleared)


def test_the_private_check_can_fail(tmp_path: Path):
    """The checker sees a sibling feature's private function, private module and private attribute."""
    fake = tmp_path / "ckpt_tool" / "formats" / "deepspeed" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from ..dcp.stream import _prod, Chunk\nfrom ..dcp import _hidden\nfrom ..dcp import stream\n"
                    "from . import _mine\n\ndef f():\n    return stream._BLOCK, stream.Chunk\n")
    init = fake.parent / "__init__.py"  # only its name counts: it marks a package
    mods = {"ckpt_tool.formats.deepspeed.x": fake, "ckpt_tool.formats.dcp.stream": fake, "ckpt_tool.formats": init,
            "ckpt_tool.formats.dcp": init, "ckpt_tool.formats.deepspeed": init}
    assert _private_reaches("ckpt_tool.formats.deepspeed.x", fake, mods) == {
        "ckpt_tool.formats.deepspeed.x: ckpt_tool.formats.dcp.stream._prod",
        "ckpt_tool.formats.deepspeed.x: ckpt_tool.formats.dcp._hidden",
        "ckpt_tool.formats.deepspeed.x: ckpt_tool.formats.dcp.stream._BLOCK",
    }
    # the same feature (and a sub-package of it) may use its own privates
    own = tmp_path / "ckpt_tool" / "formats" / "dcp" / "sub" / "y.py"
    own.parent.mkdir(parents=True)
    own.write_text("from ..stream import _prod\nfrom ... import _shared\n")
    assert _private_reaches("ckpt_tool.formats.dcp.sub.y", own, mods) == set()


def test_a_lazy_surface_name_is_an_import_of_its_module(tmp_path: Path):
    """``from ..formats import x`` where formats exports x lazily from formats.y depends on formats.y, and the
    package's TYPE_CHECKING list of its surface is no import (guards the cycle check above)."""
    init = tmp_path / "ckpt_tool" / "formats" / "__init__.py"
    init.parent.mkdir(parents=True)
    init.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .y import x as x\n"
                    "EXPORTS: dict[str, tuple[str, ...]] = {'y': ('x',)}\n")
    user = tmp_path / "ckpt_tool" / "commands" / "z.py"
    user.parent.mkdir(parents=True)
    user.write_text("from ..formats import x\n")
    known = {"ckpt_tool.formats", "ckpt_tool.formats.y", "ckpt_tool.commands.z"}
    lazy = {"ckpt_tool.formats": _lazy_exports(init)}
    assert _imports("ckpt_tool.commands.z", user, known, lazy) == {"ckpt_tool.formats", "ckpt_tool.formats.y"}
    assert _imports("ckpt_tool.formats", init, known, lazy) == set()
