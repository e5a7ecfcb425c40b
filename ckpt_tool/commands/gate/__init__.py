"""``ckpt gate``: the pre-deploy checks, their policy file, and the report CI reads."""

# The surface siblings and users import (``from ckpt_tool.commands.gate import gate`` as before the
# package split); the modules below it are the feature's own.
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports
from .command import GateCall, GateOptions, GateReport, gate, gate_paths

if TYPE_CHECKING:
    from .command import CheckName as CheckName
    from .policy import Policy as Policy, load_policy as load_policy

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "command": ("CheckName",),
    "policy": ("Policy", "load_policy"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "CheckName", "GateCall", "GateOptions", "GateReport", "Policy", "command", "gate", "gate_paths", "load_policy",
]
