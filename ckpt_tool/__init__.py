"""ckpt: inspect, diff, migrate, gate and scan PyTorch checkpoints without running them.

The public API mirrors the commands and returns plain dataclasses. Importing
this package does not import torch; only paths that need tensor data do.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "load", "inspect", "diff", "migrate", "gate", "scan", "doctor"]


def load(*args: Any, **kwargs: Any) -> Any:
    """Read a checkpoint's metadata (see ckpt_tool.formats.load)."""
    from .formats import load as _load

    return _load(*args, **kwargs)


def inspect(*args: Any, **kwargs: Any) -> Any:
    """Describe a checkpoint (see ckpt_tool.inspect.inspect)."""
    from .inspect import inspect as _inspect

    return _inspect(*args, **kwargs)


def diff(*args: Any, **kwargs: Any) -> Any:
    """Compare a checkpoint with another or with a target module (see ckpt_tool.diff)."""
    from .diff import diff as _diff

    return _diff(*args, **kwargs)


def migrate(*args: Any, **kwargs: Any) -> Any:
    """Rewrite keys and formats, atomically, with verification (see ckpt_tool.migrate)."""
    from .migrate import migrate as _migrate

    return _migrate(*args, **kwargs)


def gate(*args: Any, **kwargs: Any) -> Any:
    """Run the pre-deploy checks (see ckpt_tool.gate)."""
    from .gate import gate as _gate

    return _gate(*args, **kwargs)


def scan(*args: Any, **kwargs: Any) -> Any:
    """Statically scan pickles for dangerous globals (see ckpt_tool.scan)."""
    from .scan import scan as _scan

    return _scan(*args, **kwargs)


def doctor(*args: Any, **kwargs: Any) -> Any:
    """Report the environment and check each device (see ckpt_tool.doctor)."""
    from .doctor import doctor as _doctor

    return _doctor(*args, **kwargs)
