"""``ckpt gate``: the pre-deploy checks, their policy file, and the report CI reads."""

# The surface siblings and users import (``from ckpt_tool.commands.gate import gate`` as before the
# package split); the modules below it are the feature's own.
from .command import GateCall, GateOptions, GateReport, gate, gate_paths

__all__ = ["GateCall", "GateOptions", "GateReport", "gate", "gate_paths"]
