"""Tensor-parallel shards merged into whole tensors by rules (DeepSpeed runs, Megatron-LM legacy folders).

The rules come from the run (``universal_checkpoint_info``) or from the
user (``--tp-rules FILE``); the merge is byte ranges, no tensor assembled.
"""
from .tpmerge import merge_ranks
from .tprules import UC_INFO, TpRule, TpRules, from_universal_info, load_rules, parse_rules

__all__ = ["UC_INFO", "TpRule", "TpRules", "from_universal_info", "load_rules", "merge_ranks", "parse_rules"]
