"""``ckpt inspect``: what is in a checkpoint, from metadata alone."""

# The surface siblings and users import (``from ckpt_tool.commands.inspect import inspect`` as before the
# package split); the modules below it are the feature's own.
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports
from .command import InspectCall, InspectOptions, InspectReport, inspect, inspect_input, subclass_json
from .facts import (
    DeepSpeedRun,
    DistributedSafetensors,
    MegatronCore,
    MegatronLegacy,
    ShardedSet,
    SourceFacts,
    source_facts,
)

if TYPE_CHECKING:
    from .command import layout_notes as layout_notes

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "command": ("layout_notes",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "DeepSpeedRun", "DistributedSafetensors", "InspectCall", "InspectOptions", "InspectReport", "MegatronCore",
    "MegatronLegacy", "ShardedSet", "SourceFacts", "command", "inspect", "inspect_input", "layout_notes",
    "source_facts", "subclass_json",
]
