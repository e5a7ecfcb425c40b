"""``ckpt inspect``: what is in a checkpoint, from metadata alone."""

# The surface siblings and users import (``from ckpt_tool.commands.inspect import inspect`` as before the
# package split); the modules below it are the feature's own.
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

__all__ = ["DeepSpeedRun", "DistributedSafetensors", "InspectCall", "InspectOptions", "InspectReport", "MegatronCore",
           "MegatronLegacy", "ShardedSet", "SourceFacts", "inspect", "inspect_input", "source_facts", "subclass_json"]
