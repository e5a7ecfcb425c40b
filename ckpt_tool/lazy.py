"""A package's surface imported on first use (PEP 562), so that naming a package costs no import of its modules.

A sub-package lists what its siblings use in its ``__init__``; imported
eagerly, that list would load every module of the package (and their
dataclasses) whenever one of them is needed, on paths such as ``ckpt
inspect`` whose import time is measured. Each ``__init__`` instead sets
``__getattr__ = lazy_exports(__name__, {module: names})`` and imports the
same names under ``TYPE_CHECKING`` (``name as name``: re-exported) for mypy and editors.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, tuple[str, ...]]) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package``: each exported name imported from its module on first use."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # the next use is a plain attribute
        return value

    return __getattr__

