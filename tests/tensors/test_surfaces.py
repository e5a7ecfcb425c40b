"""Each tensors/ sub-package's surface: what its ``__init__`` exports resolves, mypy sees the same names, no torch.

The exports are imported on first use (ckpt_tool/lazy.py); a name listed for
the lazy import but missing from the ``TYPE_CHECKING`` imports (or the
reverse) would type-check one way and run another.
"""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ["data", "numerics", "target", "runtime"]
ROOT = Path(__file__).resolve().parents[2] / "ckpt_tool" / "tensors"


def _type_checking_names(package: str) -> dict[str, tuple[str, ...]]:
    tree = ast.parse((ROOT / package / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {node.module or "": tuple(a.name for a in node.names)
            for node in block.body if isinstance(node, ast.ImportFrom)}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_export_resolves_and_is_typed(package: str) -> None:
    module = importlib.import_module(f"ckpt_tool.tensors.{package}")
    assert {m: set(n) for m, n in module.EXPORTS.items()} == \
        {m: set(n) for m, n in _type_checking_names(package).items()}
    assert sorted(module.__all__) == sorted(name for names in module.EXPORTS.values() for name in names)
    for source, names in module.EXPORTS.items():
        real = importlib.import_module(f"ckpt_tool.tensors.{package}.{source}")
        for name in names:
            assert getattr(module, name) is getattr(real, name)


def test_unknown_name_is_an_attribute_error() -> None:
    data = importlib.import_module("ckpt_tool.tensors.data")
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = data.nothing_here


def test_naming_the_packages_imports_neither_torch_nor_their_modules() -> None:
    code = ("import sys, ckpt_tool.tensors.data, ckpt_tool.tensors.numerics, ckpt_tool.tensors.target, "
            "ckpt_tool.tensors.runtime\n"
            "from ckpt_tool.tensors.data import is_tensor\n"
            "print(sorted(m for m in sys.modules if m.startswith('ckpt_tool.tensors.') and m.count('.') == 3))\n"
            "print('torch' in sys.modules, 'numpy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["['ckpt_tool.tensors.data.packed']", "False False"]
