"""``ckpt inspect``: what is in a checkpoint, from metadata alone."""

# The surface siblings and users import (``from ckpt_tool.commands.inspect import inspect`` as before the
# package split); the modules below it are the feature's own.
from .command import InspectReport, inspect, subclass_json
from .facts import (
    DeepSpeedRun,
    DistributedSafetensors,
    MegatronCore,
    MegatronLegacy,
    ShardedSet,
    SourceFacts,
    source_facts,
)

__all__ = ["DeepSpeedRun", "DistributedSafetensors", "InspectReport", "MegatronCore", "MegatronLegacy", "ShardedSet",
           "SourceFacts", "inspect", "source_facts", "subclass_json"]
