"""ckpt: inspect, diff, migrate, gate and scan PyTorch checkpoints without running them.

The public API mirrors the commands; each result is the command's frozen
report, and its ``str()`` is the text the CLI prints::

    import ckpt_tool
    report = ckpt_tool.inspect("model.pth")
    print(report)                       # what `ckpt inspect model.pth` prints
    result = ckpt_tool.diff("a.pth", target="pkg.mod:Net")
    result = ckpt_tool.diff(model.state_dict(), "a.pth", values=True)   # objects too:
    result = ckpt_tool.diff("a.pth", target=Net)         # a module class or instance

Importing this package imports neither torch nor the command modules: each
name is imported on first use (PEP 562), so ``ckpt inspect`` stays fast. The
``TYPE_CHECKING`` imports below are what mypy and editors see: the real
signatures (the package ships ``py.typed``). docs/api.md documents them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (
    CkptError,
    InputError,
    LimitExceeded,
    NotEnoughSpace,
    OutputExists,
    RuleConflict,
    TargetError,
    UnsafeContentError,
    UnsupportedFormat,
    UsageError,
    WriteError,
)
from .format_names import Format, OutputFormat
from .version import __version__

if TYPE_CHECKING:
    from .api.diff import DiffReport, diff
    from .api.doctor import DoctorReport, doctor
    from .api.gate import GateReport, gate
    from .api.inspect import InspectReport, inspect
    from .api.migrate import MigrateReport, migrate
    from .api.scan import ScanReport, scan
    from .commands.gate.policy import Policy, load_policy
    from .formats import load
    from .io.remote.session import remote_session
    from .limits import Limits
    from .model import Checkpoint, TensorMeta

# name -> (module, attribute), imported on first use.
_LAZY: dict[str, tuple[str, str]] = {
    "load": ("formats", "load"),
    "inspect": ("api.inspect", "inspect"),
    "diff": ("api.diff", "diff"),
    "migrate": ("api.migrate", "migrate"),
    "gate": ("api.gate", "gate"),
    "scan": ("api.scan", "scan"),
    "doctor": ("api.doctor", "doctor"),
    # ``with remote_session(download=True) as s:`` around calls on URLs: --download, and s.requests/s.bytes
    "remote_session": ("io.remote.session", "remote_session"),
    "InspectReport": ("api.inspect", "InspectReport"),
    "DiffReport": ("api.diff", "DiffReport"),
    "MigrateReport": ("api.migrate", "MigrateReport"),
    "GateReport": ("api.gate", "GateReport"),
    "ScanReport": ("api.scan", "ScanReport"),
    "DoctorReport": ("api.doctor", "DoctorReport"),
    "Checkpoint": ("model", "Checkpoint"),
    "TensorMeta": ("model", "TensorMeta"),
    "Limits": ("limits", "Limits"),
    "Policy": ("commands.gate.policy", "Policy"),
    "load_policy": ("commands.gate.policy", "load_policy"),
}

__all__ = [  # every name above: tests/test_api.py checks the list against _LAZY and the imports
    "Checkpoint", "CkptError", "DiffReport", "DoctorReport", "Format", "GateReport", "InputError", "InspectReport",
    "LimitExceeded", "Limits", "MigrateReport", "NotEnoughSpace", "OutputExists", "OutputFormat", "Policy",
    "RuleConflict", "ScanReport", "TargetError", "TensorMeta", "UnsafeContentError", "UnsupportedFormat",
    "UsageError", "WriteError", "__version__", "diff", "doctor", "gate", "inspect", "load", "load_policy",
    "migrate", "remote_session", "scan",
]


def __getattr__(name: str) -> object:
    """Import an API name on first use (PEP 562), and keep it so the next lookup is a plain attribute."""
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(importlib.import_module(f".{target[0]}", __name__), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
