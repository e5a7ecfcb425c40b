"""ckpt: inspect, diff, migrate, gate and scan PyTorch checkpoints without running them.

The public API mirrors the commands and returns plain dataclasses::

    import ckpt_tool
    report = ckpt_tool.inspect("model.pth")
    result = ckpt_tool.diff("a.pth", target="pkg.mod:Net")

Importing this package imports neither torch nor the command modules: each
API function is imported on first use, so ``ckpt inspect`` stays fast.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

# API name -> (module, function). The modules share the API's names
# (ckpt_tool/diff.py holds diff()), which Python's import system would
# otherwise bind over the functions when a submodule is first imported.
_API: dict[str, tuple[str, str]] = {
    "load": ("formats", "load"),
    "inspect": ("inspect", "inspect"),
    "diff": ("diff", "diff"),
    "migrate": ("migrate", "migrate"),
    "gate": ("gate", "gate"),
    "scan": ("scan", "scan"),
    "doctor": ("doctor", "run_doctor"),
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """Import an API function on first use (PEP 562)."""
    target = _API.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f".{target[0]}", __name__)
    return getattr(module, target[1])


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))


class _Package(types.ModuleType):
    """Keeps ``ckpt_tool.diff`` the function after ``ckpt_tool/diff.py`` is imported.

    The import system records a submodule as an attribute of its package;
    for the API names that record is skipped, so attribute access falls
    through to ``__getattr__`` above. The submodules stay importable as
    usual (``from ckpt_tool.diff import compare_tensors``).
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
