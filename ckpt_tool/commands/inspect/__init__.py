"""``ckpt inspect``: what is in a checkpoint, from metadata alone."""

# The surface siblings and users import (``from ckpt_tool.commands.inspect import inspect`` as before the
# package split); the modules below it are the feature's own.
from .command import InspectCall, InspectOptions, InspectReport, inspect, inspect_input

__all__ = ["InspectCall", "InspectOptions", "InspectReport", "inspect", "inspect_input"]
