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
from typing import Any

from .version import __version__

# API name -> (module, function). Each command lives in ckpt_tool/commands/.
_API: dict[str, tuple[str, str]] = {
    "load": ("formats", "load"),
    "inspect": ("commands.inspect.inspect", "inspect"),
    "diff": ("commands.diff.diff", "diff"),
    "migrate": ("commands.migrate.migrate", "migrate"),
    "gate": ("commands.gate.gate", "gate"),
    "scan": ("commands.scan.scan", "scan"),
    "doctor": ("commands.doctor.doctor", "run_doctor"),
    # ``with remote_session(download=True) as s:`` around calls on URLs: --download, and s.requests/s.bytes
    "remote_session": ("io.remote.session", "session"),
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
