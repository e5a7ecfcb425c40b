"""Each feature package is entered through its ``__init__``: no module reaches into another package's modules.

A package's ``__all__`` is its surface: the names (or the submodules it
offers as namespaces) other packages may import from it. Names defined in
a module are exported lazily (``EXPORTS`` and ``__getattr__ =
lazy_exports(...)``, ckpt_tool/lazy.py), with the same names imported under
``TYPE_CHECKING`` for mypy. A module may import freely inside its own
package and from the packages above it (its feature's own modules and the
vocabulary at the root); everything else goes through a surface, so a
package can reorganise its modules without edits elsewhere. The root
package (``ckpt_tool/__init__.py``, the public API's own lazy table) is the
one exception: it is the surface of everything.
"""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "ckpt_tool"
ROOT = "ckpt_tool"


def _modules() -> dict[str, tuple[Path, bool]]:
    out: dict[str, tuple[Path, bool]] = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (p, is_package)
    return out


MODULES = _modules()
PACKAGES = sorted(m for m, (_, is_package) in MODULES.items() if is_package and m != ROOT)


def _package(module: str) -> str:
    return module if MODULES[module][1] else module.rpartition(".")[0]


def _inside(package: str, owner: str) -> bool:
    """Whether ``package`` is ``owner`` or below it: its own feature's modules are not another package's."""
    return package == owner or package.startswith(owner + ".") or owner == ROOT


def _assigned(package: str, name: str) -> object:
    """The literal value ``name`` is assigned in ``package``'s ``__init__`` (None when it is not)."""
    for node in ast.parse(MODULES[package][0].read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            return ast.literal_eval(node.value)
    return None


def _surface(package: str) -> set[str]:
    return set(_assigned(package, "__all__") or ())


def _imports(module: str) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, names) of every ``from ckpt_tool... import`` in ``module``, wherever it stands."""
    path, _ = MODULES[module]
    here = _package(module)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            parts = here.split(".")
            target = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target in MODULES:
            found.append((node.lineno, target, [a.name for a in node.names]))
    return found


def test_no_module_reaches_into_another_package() -> None:
    bad = []
    for module in MODULES:
        here = _package(module)
        if here == ROOT:
            continue
        for line, target, names in _imports(module):
            if MODULES[target][1]:  # a package: only what its surface offers
                missing = [] if _inside(here, target) else sorted(set(names) - _surface(target))
                if missing:
                    bad.append(f"{module}:{line} imports {', '.join(missing)} from {target}, not in its __all__")
            elif not _inside(here, target.rpartition(".")[0]):
                bad.append(f"{module}:{line} imports from {target}: import it from {target.rpartition('.')[0]} "
                           "(its __init__ exports what other packages use)")
    assert not bad, "\n".join(bad)


def _type_checking_names(package: str) -> dict[str, set[str]]:
    tree = ast.parse(MODULES[package][0].read_text())
    found: dict[str, set[str]] = {}
    for block in tree.body:
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING":
            for node in block.body:
                if isinstance(node, ast.ImportFrom) and node.level == 1:
                    found.setdefault(node.module or "", set()).update(a.name for a in node.names)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_every_surface_name_resolves_and_is_typed(package: str) -> None:
    """A lazily exported name mypy does not see (or the reverse) would type-check one way and run another."""
    exports = _assigned(package, "EXPORTS") or {}
    assert isinstance(exports, dict)
    typed = _type_checking_names(package)
    assert {m: set(n) for m, n in exports.items()} == {m: n for m, n in typed.items() if m in exports}
    module = importlib.import_module(package)
    for source, names in exports.items():
        real = importlib.import_module(f"{package}.{source}")
        for name in names:
            assert name in _surface(package), f"{package}.EXPORTS has {name}, not in __all__"
            assert getattr(module, name) is getattr(real, name)
    for name in _surface(package):
        assert hasattr(module, name) or importlib.util.find_spec(f"{package}.{name}") is not None, (
            f"{package}.__all__ lists {name}, which it does not define")


def test_unknown_name_is_an_attribute_error() -> None:
    formats = importlib.import_module("ckpt_tool.formats.checkpoint")
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = formats.nothing_here


def test_naming_every_package_imports_no_torch() -> None:
    """A surface costs nothing until a name is used: importing every package leaves torch and NumPy out."""
    code = ("import sys\n" + "".join(f"import {p}\n" for p in PACKAGES)
            + "print('torch' in sys.modules, 'numpy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
