"""DeepSpeed run folders (ZeRO 0-3, pipeline, tensor-parallel, universal) read as the consolidated model."""
from .tprules import TpRules, load_rules

__all__ = ["TpRules", "load_rules"]
